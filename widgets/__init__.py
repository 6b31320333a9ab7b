"""Textual widgets, one per pane or dialog. They render data they are given; they never do I/O."""
