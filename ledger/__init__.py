"""The ledger and what is decided from it, by family: ledger.cost (the cost ledger), ledger.verdict (the audit's
verdict of one run) and ledger.files (evidence files: publish, hygiene); ledger.render draws their tables.

Arrows: files -> verdict -> cost; cost imports neither. Import the parts from their modules.
"""
