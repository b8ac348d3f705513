"""`orch init`: a training script's arguments read statically (ast, nothing imported), the draft recipe, protocol
and DEV scorer written beside it, and the launch's check of an arm's script. Imports no other room of orchestrator.
"""
