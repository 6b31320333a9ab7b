"""Stage scripts the console fires on the box (`python3 SCRIPT ...`): standard library only, Python >= 3.8."""
