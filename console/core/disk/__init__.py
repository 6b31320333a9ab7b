"""The disk: its budget, what a stage adds, how fast it fills, the artifacts' sizes."""
