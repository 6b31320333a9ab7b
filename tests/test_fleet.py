"""The fleet (issue 22): every box of the config at once, on the command line and on the fleet
screen. Real boxes: three local ones with their own workspaces, a real OpenSSH server on
loopback, and a port that accepts connections and never says a word (a hung box)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from textual.command import CommandList
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.connect import open_box
from samai.console.core.fleet import DEFAULT_BOX, Fleet, fleet_configs, gather_boxes
from samai.console.screens.dialogs import HelpScreen
from samai.console.screens.fleet import FleetScreen
from samai.remote.model import Snapshot
from samai.widgets.alerts import AlertsPane
from samai.widgets.fleet import FleetTable
from samai.widgets.footer import KeysFooter
from tests import sshd
from tests.helpers import pilot_until, run_cli

SSHD_HERE = sshd.available() or bool(os.environ.get("SAMAI_REQUIRE_SSHD"))
needs_sshd = pytest.mark.skipif(not SSHD_HERE, reason="needs root and openssh-server (.ci/run installs it)")
STAGE = '[stages.slow]\nkey = "z"\ncommand = "sleep 30"\n'
FAILING = '[stages.bad]\nkey = "y"\ncommand = "sleep 4; exit 3"\n'  # running at one poll, failed at a later one


@pytest.fixture(scope="module")
def sshd_server():
    if not SSHD_HERE:
        yield None
        return
    srv = sshd.SshServer(sshd.new_root()).start()
    yield srv
    srv.stop()


@pytest.fixture
def silent_port():
    """A box whose SSH port accepts (the kernel completes the handshake) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def box_table(name: str, url: str, workspace: Path | str, **extra) -> str:
    keys = "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra.items())
    return f'[boxes.{name}]\nurl = "{url}"\nworkspace = "{workspace}"\npoll_interval = 0.3\n{keys}'


def local_boxes(tmp_path: Path, names=("a", "b", "c")) -> tuple[str, dict[str, Path]]:
    spaces = {}
    for name in names:
        spaces[name] = tmp_path / f"ws-{name}"
        spaces[name].mkdir()
    return "".join(box_table(n, "local", spaces[n]) for n in names), spaces


def write_config(tmp_path: Path, tables: str, stages: str = STAGE) -> Path:
    f = tmp_path / "fleet.toml"
    f.write_text('pipeline = "fleet"\n' + tables + stages)
    return f


# ------------------------------------------------------------------ the command line


@pytest.mark.slow
def test_box_selects_the_box_each_command_works_on(tmp_path: Path) -> None:
    tables, spaces = local_boxes(tmp_path)
    cfg = write_config(tmp_path, tables)
    fired = run_cli("--config", str(cfg), "--box", "b", "fire", "slow", "--yes")
    assert fired.returncode == 0, fired.stderr
    assert (spaces["b"] / ".samai" / "state" / "slow.json").exists()
    assert not (spaces["a"] / ".samai" / "state").exists() and not (spaces["c"] / ".samai" / "state").exists()
    # The option after the command works too, as every global option does.
    stopped = run_cli("--config", str(cfg), "stop", "slow", "--box", "b", "--yes", "--grace", "1")
    assert stopped.returncode == 0, stopped.stderr


def test_an_unknown_box_is_a_usage_error_naming_the_declared_ones(tmp_path: Path) -> None:
    tables, _ = local_boxes(tmp_path)
    r = run_cli("--config", str(write_config(tmp_path, tables)), "--box", "zz", "snapshot")
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown box 'zz'" in r.stderr and "a, b, c" in r.stderr and r.stderr.count("\n") == 1
    plain = run_cli("--box", "zz", "snapshot")  # the built-in config has no boxes at all
    assert plain.returncode == 2 and "no [boxes.NAME]" in plain.stderr


@needs_sshd
def test_all_boxes_one_hung_box_hides_none_of_the_others(tmp_path: Path, sshd_server, silent_port: int) -> None:
    tables, spaces = local_boxes(tmp_path)
    ssh_ws = tmp_path / "ws-ssh"
    ssh_ws.mkdir()
    tables += box_table("remote", sshd_server.url(), ssh_ws, python=sys.executable)
    tables += box_table("hung", f"ssh://root@127.0.0.1:{silent_port}", "samai/hung", connect_timeout=1.5)
    cfg = write_config(tmp_path, tables)
    assert run_cli("--config", str(cfg), "--box", "b", "fire", "slow", "--yes").returncode == 0
    r = run_cli("--config", str(cfg), "snapshot", "--json", "--all-boxes", env={"HOME": str(sshd_server.client_home)})
    assert r.returncode == 1, r.stderr  # some boxes answered, one did not
    assert r.stderr.count("\n") == 1 and "hung" in r.stderr
    boxes = json.loads(r.stdout)["boxes"]
    assert list(boxes) == ["a", "b", "c", "remote", "hung"]
    assert boxes["hung"]["state"] == "unreachable" and boxes["hung"]["error"]
    for name in ("a", "b", "c", "remote"):
        assert boxes[name]["processes"] and "gpu_findings" in boxes[name], name
    # Each box read its own workspace: the stage fired on b is b's alone.
    assert [s["stage"] for s in boxes["b"]["states"]] == ["slow"]
    assert all(boxes[n]["states"] == [] for n in ("a", "c", "remote"))
    run_cli("--config", str(cfg), "--box", "b", "stop", "slow", "--yes", "--grace", "1")


@pytest.mark.slow
def test_all_boxes_of_a_config_without_boxes_is_one_named_default(tmp_path: Path, workspace: Path) -> None:
    f = tmp_path / "one.toml"
    f.write_text(f'[workspace]\npath = "{workspace}"\n' + STAGE)
    r = run_cli("--config", str(f), "snapshot", "--json", "--all-boxes")
    assert r.returncode == 0, r.stderr
    assert list(json.loads(r.stdout)["boxes"]) == [DEFAULT_BOX]
    text = run_cli("--config", str(f), "snapshot", "--all-boxes")
    assert text.returncode == 0 and text.stdout.startswith(f"== {DEFAULT_BOX} (local)")
    both = run_cli("--config", str(f), "snapshot", "--all-boxes", "--target", "local")
    assert both.returncode == 2 and "--all-boxes" in both.stderr


async def test_the_others_answer_while_a_hung_box_still_waits(tmp_path: Path, silent_port: int) -> None:
    """No timing assert: the three local boxes' snapshots are all in while the hung box's connect
    (given a minute) is still pending; the order of events is the proof."""
    tables, _ = local_boxes(tmp_path)
    tables += box_table("hung", f"ssh://root@127.0.0.1:{silent_port}", "samai/hung", connect_timeout=60)
    configs = fleet_configs(config.load(write_config(tmp_path, tables)))
    answered: list[str] = []
    others_in = asyncio.Event()

    async def fetch(cfg: config.Config) -> Snapshot:
        box = open_box(cfg, readonly=True)
        try:
            snap = await box.snapshot()
        finally:
            await box.close()
        answered.append(cfg.workspace)
        if len(answered) == 3:
            others_in.set()
        return snap

    task = asyncio.create_task(gather_boxes(configs, fetch))
    await asyncio.wait_for(others_in.wait(), 60)
    assert not task.done()  # the hung box is still connecting: nobody waited for it
    assert sorted(answered) == sorted(c.workspace for n, c in configs if n != "hung")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.slow
async def test_the_fleet_model_polls_each_box_on_its_own(tmp_path: Path, silent_port: int) -> None:
    tables, spaces = local_boxes(tmp_path)
    tables += box_table("hung", f"ssh://root@127.0.0.1:{silent_port}", "samai/hung", connect_timeout=1)
    fleet = Fleet(config.load(write_config(tmp_path, tables)), lambda cfg: open_box(cfg))
    try:
        rows = await asyncio.gather(*(w.poll_once() for w in fleet.watches))
    finally:
        await fleet.close()
    assert [r.name for r in rows] == ["a", "b", "c", "hung"]
    assert [r.state for r in rows] == ["connected"] * 3 + ["unreachable"]
    assert rows[3].error and rows[0].disk_used and rows[0].rtt is not None and rows[0].polls == 1


# ------------------------------------------------------------------ the fleet screen


def _live_probes() -> dict[int, str]:
    """The live probes among this process's children (local boxes' probes): pid -> the workspace
    its tools run from (`python -S -c STARTER WS/.samai/tools/DIGEST probe --serve`), "" for one
    loaded from stdin (a read-only box's: the fleet's rows). Only those: under load a box's
    one-shot reads and children not yet reaped are there too."""
    probes = {}
    for child in psutil.Process().children():
        try:
            argv = child.cmdline()
            if child.status() != psutil.STATUS_ZOMBIE and argv[-2:] == ["probe", "--serve"]:
                probes[child.pid] = str(Path(argv[-3]).parents[2]) if argv[-3].startswith("/") else ""
        except psutil.Error:  # ended between the listing and the look
            pass
    return probes


def _probes_since(before: set[int], spaces: dict[str, Path]) -> Counter[str]:
    """The probes started since `before`, by box (the box screen's) or as "row" (the fleet's)."""
    names = {str(space): name for name, space in spaces.items()}
    return Counter(names.get(ws, ws) if ws else "row" for pid, ws in _live_probes().items() if pid not in before)


def _cell(table: FleetTable, box: str, column: str) -> str:
    """The cell's text; "" while its row is not there yet (the rows come after the screen's first
    paint: under load a wait's first look came before them, and failed the CI run)."""
    try:
        return str(table.get_cell(box, column))
    except CellDoesNotExist:
        return ""


async def test_the_fleet_screen_rows_enter_back_and_the_palette(tmp_path: Path, sshd_server, monkeypatch) -> None:
    tables, spaces = local_boxes(tmp_path)
    names = ["a", "b", "c"]
    if sshd_server is not None:  # a real SSH box beside the local ones
        monkeypatch.setenv("HOME", str(sshd_server.client_home))
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        (tmp_path / "ws-ssh").mkdir()
        tables += box_table("remote", sshd_server.url(), tmp_path / "ws-ssh", python=sys.executable)
        names.append("remote")
    with socket.socket() as hung:  # a box that never answers: its row says so, and holds up no other
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        tables += box_table("hung", f"ssh://root@127.0.0.1:{hung.getsockname()[1]}", "samai/hung", connect_timeout=1)
        f = write_config(tmp_path, tables, STAGE + FAILING)
        await _drive_the_fleet(tmp_path, f, names, spaces, sshd_server)


def _palette_choice(app: SamaiApp) -> str:
    """The command the palette's Enter would run now, as its list shows it ("" while none)."""
    found = app.screen.query(CommandList)
    option = found.first().highlighted_option if found else None
    return str(option.prompt) if option is not None else ""


async def _drive_the_fleet(tmp_path: Path, f: Path, names: list[str], spaces: dict[str, Path], sshd_server) -> None:
    app = SamaiApp(config.load(f))
    before = set(_live_probes())  # an earlier test's, left running: not this console's
    async with app.run_test(size=(170, 45)) as pilot:
        fleet = await pilot_until(pilot, lambda: isinstance(app.screen, FleetScreen) and app.screen)  # at start
        table = fleet.query_one(FleetTable)
        await pilot_until(pilot, lambda: all(_cell(table, n, "connection") == "connected" for n in names))
        assert [k.value for k in table.rows] == [*names, "hung"] and app.box is None  # no box screen polled yet
        await pilot_until(pilot, lambda: _cell(table, "hung", "connection") == "unreachable"
                          and fleet.fleet.watch("hung").row.error)
        await pilot_until(pilot, lambda: _cell(table, "hung", "alert"))  # why, in the row's widest column
        assert all(_cell(table, n, "rtt").endswith(" ms") and " / " in _cell(table, n, "disk") for n in names)

        # A stage fired on b (by another console: the CLI) shows on b's row, and on no other.
        fired = await asyncio.to_thread(run_cli, "--config", str(f), "--box", "b", "fire", "slow", "--yes")
        assert fired.returncode == 0, fired.stderr
        await pilot_until(pilot, lambda: _cell(table, "b", "running") == "slow")
        assert all(_cell(table, n, "running") == "—" for n in names if n != "b")

        # Enter on b's row: b's screen, on b's workspace, with the stage it runs.
        table.move_cursor(row=1)
        await pilot.press("enter")
        await pilot_until(pilot, lambda: not isinstance(app.screen, FleetScreen) and app.state.snapshot
                          and app.state.snapshot.state("slow"))
        assert app.box_name == "b" and app.config.workspace == str(spaces["b"])
        assert "b: local" in str(app.box_screen.query_one("#status").render())
        b_box = app.box

        # F: back to the fleet, whose rows kept polling meanwhile.
        await pilot.press("F")
        await pilot_until(pilot, lambda: isinstance(app.screen, FleetScreen))
        polls = fleet.fleet.watch("a").row.polls
        await pilot_until(pilot, lambda: fleet.fleet.watch("a").row.polls > polls)

        # `?` from the fleet lists every key, the fleet's own among them.
        await pilot.press("question_mark")
        help_screen = await pilot_until(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen)
        help_table = help_screen.query_one(DataTable)
        ids = {str(help_table.get_row_at(i)[3]) for i in range(help_table.row_count)}
        assert {"app.fleet", "fleet.open", "fleet.back", "app.kill", "stage.slow"} <= ids
        await pilot.press("escape")
        await pilot_until(pilot, lambda: isinstance(app.screen, FleetScreen))
        assert "Fleet" not in str(app.screen.query_one(KeysFooter).render())  # already here: F is not offered
        assert "Open box" in str(app.screen.query_one(KeysFooter).render())

        # The palette: "Switch to box c" points the box screen at c, b's connection closed.
        await pilot.press("ctrl+p")
        await pilot.press(*"Switch", "space", "to", "space", "box", "space", "c")
        await pilot_until(pilot, lambda: "Switch to box c" in _palette_choice(app))  # the search is async
        await pilot.press("enter")
        await pilot_until(pilot, lambda: app.box_name == "c" and not isinstance(app.screen, FleetScreen)
                          and app.state.snapshot is not None)
        assert app.config.workspace == str(spaces["c"]) and app.box is not b_box
        # b's probe ended with its connection: the local boxes' probes are the fleet's three and c's one.
        try:
            await pilot_until(pilot, lambda: _probes_since(before, spaces) == Counter(row=3, c=1))
        except AssertionError:
            raise AssertionError(f"probes by box: {dict(_probes_since(before, spaces))}") from None
        assert app.state.snapshot.state("slow") is None  # c's own state: nothing of b's

        # An alert on c says it is c's, in the alerts pane and on c's row of the fleet.
        bad = await asyncio.to_thread(run_cli, "--config", str(f), "--box", "c", "fire", "bad", "--yes")
        assert bad.returncode in (0, 1), bad.stderr
        await pilot_until(pilot, lambda: any(a.active and a.stage == "bad" and a.severity == "error"
                                             for a in app.state.alerts))
        assert "c: stage bad failed rc=3" in str(app.box_screen.query_one(AlertsPane).render())
        await pilot_until(pilot, lambda: "bad failed" in _cell(table, "c", "alert"))
        assert "connected" not in _cell(table, "hung", "connection")


@pytest.mark.slow
async def test_one_box_has_no_fleet_key(tmp_path: Path, workspace: Path) -> None:
    f = tmp_path / "one.toml"
    f.write_text(f'[target]\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n' + STAGE)
    app = SamaiApp(config.load(f), poll=False)
    async with app.run_test(size=(170, 45)) as pilot:
        await pilot.press("F")
        footer = app.box_screen.query_one(KeysFooter)
        assert not isinstance(app.screen, FleetScreen) and "Fleet" not in str(footer.render())
        await pilot.press("question_mark")
        help_screen = await pilot_until(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen)
        # the later key's screen came: F's would have come before it
        assert not any(isinstance(s, FleetScreen) for s in app.screen_stack)
        table = help_screen.query_one(DataTable)
        assert "app.fleet" not in {str(table.get_row_at(i)[3]) for i in range(table.row_count)}


@pytest.mark.slow
async def test_escape_from_the_fleet_at_start_opens_the_first_box_and_box_opens_one_at_once(tmp_path: Path) -> None:
    tables, spaces = local_boxes(tmp_path, ("a", "b"))
    cfg = config.load(write_config(tmp_path, tables))
    app = SamaiApp(cfg)
    async with app.run_test(size=(170, 45)) as pilot:
        await pilot_until(pilot, lambda: isinstance(app.screen, FleetScreen))
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, FleetScreen) and app.state.snapshot is not None)
        assert app.box_name == "a" and app.config.workspace == str(spaces["a"])
    app = SamaiApp(cfg, box="b")  # `--box b`: b's screen at once, the fleet a key away
    async with app.run_test(size=(170, 45)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot is not None)
        assert not isinstance(app.screen, FleetScreen) and app.config.workspace == str(spaces["b"])


def test_a_row_shows_gpus_and_quotes_the_box_literally() -> None:
    from samai.console.core.alertbook import Alert
    from samai.console.core.fleet import BoxRow
    from samai.widgets.fleet import cells

    row = BoxRow("a", "ssh://op@gpu-a", "lost", error="\x1b]0;owned\x07[/x] gone", running=("[bold]t",),
                 gpu_count=2, gpu_util=37.5, gpu_memory_used=3_000_000_000, gpu_memory_total=80_000_000_000,
                 alert=Alert(1.0, "error", "[@click=app.quit]x[/] \x1b[31mred"))
    shown = {k: str(v) for k, v in cells(row, 0.0).items()}
    assert shown["gpu"] == "2× 38 % · 3.0 GB / 80.0 GB"
    assert "\x1b" not in "".join(shown.values()) and shown["connection"] == "lost"
    assert shown["running"] == "[bold]t" and shown["alert"].startswith("error [@click=app.quit]x[/] ")
    why = str(cells(replace(row, alert=None), 0.0)["alert"])  # no alert: why it is not read, literally
    assert "\x1b" not in why and why.endswith("[/x] gone")


@pytest.mark.slow
async def test_a_poll_that_ends_after_the_screens_are_gone_is_no_crash(tmp_path: Path) -> None:
    """With many boxes a poll may end while the app closes: its last tick finds no screen to mark
    stale, and says nothing (it raised ScreenStackError and failed the run)."""
    tables, _ = local_boxes(tmp_path)
    app = SamaiApp(config.load(write_config(tmp_path, tables)), poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
    assert not app.screen_stack
    app.state.received_at = app.clock() - 3600  # stale: the tick would mark the screen
    app.box_screen.tick()
