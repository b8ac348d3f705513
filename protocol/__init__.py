"""Protocol contracts of orch: the frozen upstream recipe, the protocol.yaml model and the error types, the documents
that cross a process boundary; host/ the host observed beside a run (step clock, quiet host, NVML).

Everything else builds on these; this package imports neither torch nor any other orch package.
"""
