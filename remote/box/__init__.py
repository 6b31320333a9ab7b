"""Tools that run ON the box: standard library only, Python >= 3.8, one JSON request on stdin.

On the box this package is samai_box, installed by the console (samai.remote.boxtools) and run
as `python3 -S FOLDER TOOL`; its modules import each other relatively only, so the same code is
samai.remote.box here and samai_box there."""
