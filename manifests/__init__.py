"""Source manifests: SHA256 of each runtime source file and a root digest, the published commitment.

`orch freeze` writes them, `orch verify` compares a tree with one; the launcher re-hashes sealed copies with them.
"""
