"""The trust boundary: what a package can read, write, reach and leave running. Namespaces or the scan, cgroups,
process groups, the allow-listed environment, sealing, the compile-cache seals and orch's safe paths into package
output; docs/THREAT_MODEL.md says what each guarantees. Imports no other room of orchestrator.
"""
