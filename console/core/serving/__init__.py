"""A running server: its monitoring endpoints read and judged, the smoke answer."""
