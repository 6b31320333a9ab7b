"""The built-in pipelines (samai.toml files), read with importlib.resources."""
