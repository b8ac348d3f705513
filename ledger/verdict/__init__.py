"""The verdict of a run, in two rooms: decide/ (the run's evidence loaded and checked, exactness, the owner's windows,
their statistics and the verdict rule) and documents/ (the audit document, its blocks and renderings, `orch audit`).
documents imports decide, never the reverse. This face imports nothing: import the parts from their modules.
"""
