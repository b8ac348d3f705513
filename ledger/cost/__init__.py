"""The cost ledger: the append-only, tamper-evident record of every package (store, verify, Merkle heads,
witnessed heads, salted host) and its accounting (summary, list, export).
"""
