"""A training run: its log, its curve, its reference, its lineage, its checkpoints and its resume."""
