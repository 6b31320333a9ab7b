"""The console's screens and dialogs: each one is a view with its keys and its workers (widgets/ holds the panes)."""
