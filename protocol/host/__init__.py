"""What orch observes of the host beside a run, as data: the step clock outside the trainer's interpreter (clock),
the quiet-host and host-watch documents (quiet_host), and NVML named once (gpu_library).
Imports nothing of orch; the rest of protocol, the workers, the ledger and orchestrator import it.
"""
