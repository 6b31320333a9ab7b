"""The stages the console fires on the box, and the modules they share (common, locks, transfer,
archives): `python3 -m samai_box.stages.NAME ...`, the ML stages from the box venv's python."""
