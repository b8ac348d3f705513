"""What runs inside every torchrun rank around the unmodified trainer (entry point: workers/probe.py): the probe's step
hook and records, the digests (tx128), the forbidden-dtype watch, the trainer's own numbers, the prime's stop, how a
rank ends. Imports protocol and itself, nothing else of workers; the entry points beside it import it.
"""
