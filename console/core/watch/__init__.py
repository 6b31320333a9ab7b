"""The headless watcher (`samai-console watch`): the TUI's session and state without a screen,
which tells the operator who is not looking (apprise) and may recover by policy."""
