"""Textual themes and the console's stylesheet."""
