"""Tools that run ON the box: standard library only, Python >= 3.8, one JSON request on stdin."""
