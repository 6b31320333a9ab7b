"""The console's domain: configuration, the box's state folded from snapshots, the checks and
detectors that judge it, preflight and the action layer. Nothing here imports Textual or the
command line; the app (console/app.py) and the CLI (console/cli.py) are shells around it."""
