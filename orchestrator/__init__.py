"""The orch command line and the launch pipeline, in family rooms; arrows point down the list, never up:

    cli        the `orch` and `gpu-run` command lines: parse, then call one function per command  (imports any room)
    run        `orch launch` as a pipeline, calibrate, rehearse, the host watch  (isolation, lock, slurm, init)
    init       `orch init` and the training script's arguments, read statically  (no other room)
    slurm      the Slurm allocation, srun commands and what sacct charged  (no other room)
    lock       the shared-host GPU lock and who holds each GPU  (no other room)
    isolation  the trust boundary: what a package can read, write, reach and leave running  (no other room)

Nothing imports this package; it imports protocol, manifests and ledger, and runs workers as subprocesses.
Import the parts from their modules.
"""
