"""Protocol contracts of orch: the frozen upstream recipe, the protocol.yaml model and the error types.

Everything else builds on these; this package imports neither torch nor any other orch package.
"""
