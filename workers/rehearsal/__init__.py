"""What a rehearsal of the unmodified upstream R3 trainer needs besides the upstream sources: tiny generated
inputs (`make_inputs`), a deterministic loopback reward judge (`judge`) and a flash_attn stand-in (`shim/`).
Imports protocol and itself, nothing else of workers.
"""
