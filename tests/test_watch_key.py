"""This machine's watch key (console/core/watch/trust.py) as the command line meets it: made on first
use, readable by its owner alone; one that is no key is a clear error, kept as it is."""

from __future__ import annotations

from pathlib import Path

from samai.console.core.watch.trust import Trust
from tests.helpers import run_cli
from tests.test_watch import job, toml


def test_a_watch_key_that_is_no_key_is_a_clear_error_and_is_kept(tmp_path: Path, workspace: Path,
                                                                 isolated_dirs: Path) -> None:
    """The key file is the operator's (it may be one copied from another machine): a broken one is
    said, by its path, and left as it is; never replaced by a new key behind their back."""
    path = tmp_path / "samai.toml"
    path.write_text(toml(workspace, job("true")))
    key = isolated_dirs / "xdg_state_home" / "samai" / "watch.key"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("not a key\n")
    got = run_cli("--config", str(path), "watch", "--once")
    assert got.returncode == 2 and f"{key} is not a watch key" in got.stderr, got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and key.read_text() == "not a key\n"
    key.unlink()
    assert run_cli("--config", str(path), "watch", "--once").returncode == 0
    assert Trust.load(key).id and oct(key.stat().st_mode & 0o777) == "0o600"
