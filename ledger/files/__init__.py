"""Evidence files: what may be published (aggregate, hygiene-checked) and what must never be committed.
"""
