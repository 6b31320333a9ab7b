"""samai-console: the application (config, pipeline model, actions, the Textual app, the CLI)."""

__version__ = "0.1.0"
