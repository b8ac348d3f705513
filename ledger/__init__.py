"""The cost ledger (append-only Arrow IPC stream, hash chain, RFC 6962 head, accounting), the audit and publishing.

Import the parts from their modules: ledger.store, ledger.merkle, ledger.accounting, ledger.audit.
"""
