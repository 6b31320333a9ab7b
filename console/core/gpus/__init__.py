"""The GPUs: what their readings and their history show."""
