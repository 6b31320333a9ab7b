"""Eval and computer-use runs: their summaries, their items read whole and checked, two runs compared."""
