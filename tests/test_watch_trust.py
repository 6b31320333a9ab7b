"""The watcher's memory on the box is box input, and a death always goes: real watchers (BoxWatcher
on this machine's box) against a real loopback receiver (tests/receivers.py), with real stages.

The rule, tested as one: nothing a box process can write in WORKSPACE/.samai/watch/ (any bytes,
any JSON, a forged lease, ledger or acknowledgement, a lease kept alive by a forger) makes the
watcher stop, stand by silently, or hold back a stage's death; a death is sent once, whoever
fired the stage and however fast it died; a run's end is one message."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core.connect import open_box
from samai.console.core.watch.trust import Trust
from samai.console.core.watch.watcher import BoxWatcher, watch
from tests.helpers import run_cli, until
from tests.receivers import HttpReceiver
from tests.test_watch import job, load, running, toml, watcher

pytestmark = pytest.mark.slow

DIES_AT_ONCE = "echo crashed; exit 4"


def folder(workspace: Path) -> Path:
    path = workspace / ".samai" / "watch"
    path.mkdir(parents=True, exist_ok=True)
    return path


def deaths(receiver: HttpReceiver, stage: str = "job") -> list[str]:
    return [t for t in receiver.titles() if t.startswith(f"samai: stage {stage} failed")]


async def watching(w: BoxWatcher):
    task = asyncio.ensure_future(watch([w]))
    await running(w)
    return task


async def stop(task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------- every death once, one message


async def test_a_stage_fired_from_the_cli_that_dies_at_once_is_sent_once(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    """It dies within its fire's verification window: the CLI that fired it says so to its own
    terminal, and the watcher tells the receivers."""
    path = tmp_path / "samai.toml"
    path.write_text(toml(workspace, job(DIES_AT_ONCE), watch="interval = 1"))  # as the operator runs it
    w = watcher(load(tmp_path, path.read_text()), [json_receiver.url], [])
    task = await watching(w)
    try:
        fired = await asyncio.to_thread(run_cli, "--config", str(path), "fire", "job", "--yes")
        assert fired.returncode == 1 and "crashed" in fired.stdout + fired.stderr, fired.stdout + fired.stderr
        await until(lambda: deaths(json_receiver), timeout=60)
        await running(w, 5)
    finally:
        await stop(task)
    [death] = json_receiver.got  # once: its own words ride along ("crashed"), however the chain says them
    assert death.title.startswith("samai: stage job failed rc=4"), death.title


async def test_a_refused_run_is_one_message_with_its_marker_line(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    markers = '[[stages.job.markers]]\nname = "JOB_REFUSED"\nseverity = "error"\n'
    path = tmp_path / "samai.toml"
    path.write_text(toml(workspace, job('echo "JOB_REFUSED the input holds no rows"; exit 2', extra=markers),
                         watch="interval = 0.3"))
    w = watcher(load(tmp_path, path.read_text()), [json_receiver.url], [])
    task = await watching(w)
    try:
        await asyncio.to_thread(run_cli, "--config", str(path), "fire", "job", "--yes")
        await until(lambda: json_receiver.got, timeout=60)
        await running(w, 6)
    finally:
        await stop(task)
    [one] = json_receiver.got  # its marker line's alert is no message of its own
    assert one.title.startswith("samai: stage job failed rc=2"), one.title
    assert "JOB_REFUSED the input holds no rows" in one.title + one.body


async def test_a_death_goes_through_a_storm_of_its_own_error_lines(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    """26 different error-marker lines spend the hour's cap of what box output raises; the stage's
    death, with its fix, goes all the same, and what was held back is counted."""
    words = " ".join(f"x{c}" for c in "abcdefghijklmnopqrstuvwxyz")
    storm = f'for w in {words}; do echo "FATAL $w"; done; while [ ! -e go ]; do sleep 0.1; done; exit 3'
    markers = '[[stages.job.markers]]\nname = "fatal"\npattern = "FATAL"\nseverity = "error"\n'
    cfg = load(tmp_path, toml(workspace, job(storm, extra=markers), watch="interval = 0.3",
                              notify="max_per_hour = 5"))
    w = watcher(cfg, [json_receiver.url], [])
    task = await watching(w)
    try:
        box = open_box(cfg)
        try:
            stage = cfg.stage("job")
            assert stage is not None
            await box.fire("job", stage.command, stage.log, verify_s=0.1)
        finally:
            await box.close()
        await until(lambda: "samai: notifications held back" in json_receiver.titles(), timeout=60)
        (workspace / "go").write_text("")
        await until(lambda: deaths(json_receiver), timeout=60)
        await running(w, 3)
    finally:
        await stop(task)
    [death] = [r for r in json_receiver.got if r.title.startswith("samai: stage job failed rc=3")]
    assert "press x: restart job" in death.body
    assert w.policy.held == 26 - 5  # the lines past the cap, each counted once


# ---------------------------------------------------------------- forged leases


async def test_a_forged_lease_of_a_watcher_that_never_beat_is_taken_over_and_said(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    (folder(workspace) / "leader.json").write_text(json.dumps({"id": "ghost", "until": 1e18, "since": 1.0}))
    cfg = load(tmp_path, toml(workspace, job(DIES_AT_ONCE), watch="interval = 0.3"))
    lines: list[str] = []
    w = watcher(cfg, [json_receiver.url], lines)
    task = await watching(w)
    try:
        assert w.leading and "leading: this watcher sends for the box" in lines
        lease = json.loads((folder(workspace) / "leader.json").read_text())
        assert lease["id"] == "w1" and lease["until"] < time.time() + 900
    finally:
        await stop(task)


async def test_a_lease_whose_holder_stopped_beating_is_taken_over_and_said_meanwhile_deaths_go(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    """A holder that beat once, long enough ago to lapse a few seconds from now: while it holds
    the lease the watcher says who leads since when, and sends the death itself (that beat is
    not signed with this machine's key); then it takes over and says so."""
    watch_dir = folder(workspace)
    (watch_dir / "W-ghost.json").write_text(json.dumps({"id": "ghost", "who": "mallory@box", "interval": 10,
                                                        "written": time.time() - 25}))
    (watch_dir / "leader.json").write_text(json.dumps({"id": "ghost", "until": 1e18, "since": time.time() - 3600}))
    cfg = load(tmp_path, toml(workspace, job(DIES_AT_ONCE), watch="interval = 0.3"))
    lines: list[str] = []
    w = watcher(cfg, [json_receiver.url], lines)
    task = await watching(w)
    try:
        if not w.leading:  # (a very slow start may see it lapse already)
            assert any(line.startswith("standing by: watcher mallory@box leads since ") and "not signed" in line
                       for line in lines), lines
            box = open_box(cfg)
            try:
                await box.fire("job", DIES_AT_ONCE, "logs/job.log", verify_s=0.1)
            finally:
                await box.close()
            await until(lambda: deaths(json_receiver), timeout=60)
        await until(lambda: w.leading, timeout=120)
        assert any("leading: watcher mallory@box stopped beating" in line for line in lines), lines
    finally:
        await stop(task)


@pytest.fixture
def forger(workspace: Path) -> Iterator[threading.Event]:
    """A box process that keeps a forged leader beating: its heartbeat and lease rewritten every 0.05 s."""
    done = threading.Event()
    watch_dir = folder(workspace)

    def forge() -> None:
        while not done.is_set():
            now = time.time()
            for name, value in (("W-ghost.json", {"id": "ghost", "who": "mallory@box", "interval": 1, "written": now,
                                                  "at": now, "key": "0" * 16, "mac": "0" * 64}),
                                ("leader.json", {"id": "ghost", "until": now + 60, "since": now - 60})):
                tmp = watch_dir / f".{name}.forged"
                tmp.write_text(json.dumps(value))
                os.replace(tmp, watch_dir / name)
            done.wait(0.05)

    thread = threading.Thread(target=forge, daemon=True)
    thread.start()
    yield done
    done.set()
    thread.join(5)


async def test_a_leader_forged_to_beat_forever_cannot_silence_a_death(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver, forger: threading.Event) -> None:
    cfg = load(tmp_path, toml(workspace, job(DIES_AT_ONCE), watch="interval = 0.3"))
    lines: list[str] = []
    w = watcher(cfg, [json_receiver.url], lines)
    task = await watching(w)
    try:
        assert not w.leading and w.role == "shadow"
        box = open_box(cfg)
        try:
            await box.fire("job", DIES_AT_ONCE, "logs/job.log", verify_s=0.1)
        finally:
            await box.close()
        await until(lambda: deaths(json_receiver), timeout=60)
        await running(w, 5)
    finally:
        await stop(task)
    assert [t[:28] for t in deaths(json_receiver)] == ["samai: stage job failed rc=4"]
    assert any("standing by: watcher mallory@box leads" in line and "not signed" in line for line in lines), lines


async def test_two_watchers_holding_one_key_send_once_and_the_standby_says_who_leads(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    cfg = load(tmp_path, toml(workspace, job("sleep 1; exit 6"), watch="interval = 0.3"))
    said: list[str] = []
    first = watcher(cfg, [json_receiver.url], said, ident="one")
    await first.cycle()
    second = watcher(cfg, [json_receiver.url], said, ident="two")
    task = asyncio.ensure_future(watch([first, second]))
    try:
        await running(second)
        assert first.role == "lead" and second.role == "standby"
        assert any(line.startswith("standing by: watcher op@watchhost leads since ") and "not signed" not in line
                   for line in said), said
        box = open_box(cfg)
        try:
            await box.fire("job", "sleep 1; exit 6", "logs/job.log", verify_s=0.1)
        finally:
            await box.close()
        await until(lambda: deaths(json_receiver), timeout=60)
        await running(first, 5)
    finally:
        await stop(task)
    assert len(json_receiver.got) == 1


# ---------------------------------------------------------------- the rule, as one

NOW_ISH = st.floats(min_value=-120, max_value=120).map(lambda d: time.time() + d)
NUMBER = (st.integers() | st.floats() | st.just(10**400) | st.just(-1) | st.just(1e300) | NOW_ISH | st.none()
          | st.text(max_size=4))
TEXT = st.text(alphabet=st.sampled_from("ab-_ \x1b[]\x07\x9b\u202e\u200b\n/.é"), max_size=30)
JSONISH = st.recursive(st.none() | st.booleans() | NUMBER | TEXT,
                       lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4), max_leaves=10)
IDS = st.sampled_from(["ghost", "w1", "../x", "", "a" * 80]) | TEXT
BEAT = st.fixed_dictionaries({"id": IDS, "written": NUMBER, "interval": NUMBER},
                             optional={"who": TEXT, "at": NUMBER, "key": TEXT, "mac": TEXT, "leading": JSONISH,
                                       "pid": NUMBER, "last_sent": NUMBER, "last_error": TEXT})
LEASE = st.fixed_dictionaries({"id": IDS, "until": NUMBER}, optional={"since": NUMBER, "who": TEXT})
SENT = st.dictionaries(TEXT, st.fixed_dictionaries({"first": NUMBER, "last": NUMBER, "text": TEXT,
                                                    "severity": st.sampled_from(["error", "info", "x"]),
                                                    "stage": st.sampled_from(["job", ""]), "run": NUMBER}),
                       max_size=5)
LEDGER = st.fixed_dictionaries({}, optional={"sent": SENT, "windows": st.dictionaries(TEXT, st.lists(NUMBER)),
                                             "held": JSONISH, "statuses": st.dictionaries(TEXT, TEXT),
                                             "box_at": NUMBER, "recoveries": JSONISH})
OTHER_KEY = Trust.of(b"m" * 32)  # a key some other party holds


def _json(strategy) -> st.SearchStrategy[bytes | str]:
    return strategy.map(lambda v: json.dumps(v).encode())


CONTENT = (st.binary(max_size=100) | _json(JSONISH) | st.sampled_from(["<fifo>", "<folder>", "<link>", "<huge>"]))
FILES = st.fixed_dictionaries({
    "leader.json": CONTENT | _json(LEASE),
    "W-ghost.json": CONTENT | _json(BEAT),
    "W-w1.json": CONTENT | _json(BEAT),
    "ledger.json": CONTENT | _json(LEDGER) | _json(LEDGER.map(OTHER_KEY.seal)),
    "acks.json": CONTENT | _json(st.dictionaries(TEXT, JSONISH, max_size=5)),
})


def _write(watch_dir: Path, name: str, content: bytes | str) -> None:
    path = watch_dir / name
    if content == "<fifo>":
        os.mkfifo(path)
    elif content == "<folder>":
        path.mkdir()
    elif content == "<link>":
        path.symlink_to("/etc/hostname")
    elif content == "<huge>":
        path.write_bytes(b'{"pad": "' + b"x" * (300 * 1024) + b'"}')
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)


CYCLES_TO_LEAD_OR_SHADOW = 2  # its first beat decides: it leads, or it sends the errors beside a leader
CYCLES_TO_TELL = 12  # a death is seen, its log read and it is sent within this many polls


@pytest.mark.timeout(900)  # twenty real watchers, each until a death is received, on a busy machine
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(files=FILES)
def test_nothing_written_in_the_watch_folder_stops_silences_or_holds_back_a_death(
        tmp_path: Path, json_receiver: HttpReceiver, files: dict[str, bytes | str]) -> None:
    """Whatever is in every file of the folder: real watcher cycles all return, within two it
    leads or stands by saying so (and then sends the errors itself), and a stage that dies at
    once is received, once, within a bounded number of cycles."""
    workspace = tmp_path / f"ws-{time.monotonic_ns()}"
    watch_dir = folder(workspace)
    for name, content in files.items():
        _write(watch_dir, name, content)
    cfg = load(tmp_path, toml(workspace, job(DIES_AT_ONCE), watch="interval = 0.3"))
    lines: list[str] = []
    before = len(deaths(json_receiver))

    async def example() -> None:
        w = watcher(cfg, [json_receiver.url], lines)
        try:
            for _ in range(CYCLES_TO_LEAD_OR_SHADOW):
                await w.cycle()
            assert w.role in ("lead", "shadow"), w.role  # nothing here is signed with this machine's key
            if w.role == "shadow":  # its log says who leads, or why it could not beat
                assert any(line.startswith(("standing by: watcher ", "no watcher holds the lease", "heartbeat: "))
                           for line in lines), lines
            box = open_box(cfg)
            try:
                await box.fire("job", DIES_AT_ONCE, "logs/job.log", verify_s=0.1)
            finally:
                await box.close()
            for _ in range(CYCLES_TO_TELL):
                await w.cycle()
                await w.sender.retry(w.clock())
                if len(deaths(json_receiver)) > before:
                    break
                await asyncio.sleep(0.3)
            await w.cycle()
        finally:
            await w.close()

    asyncio.run(example())
    assert len(deaths(json_receiver)) == before + 1, (json_receiver.titles(), lines)


async def test_a_server_the_watcher_restarts_that_dies_at_once_is_told_each_time_and_capped(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    """Each restart by the watcher is a new run: its death is told too, however fast, and every
    try counts towards [watch] max_recoveries (a restart that dies at once is no loop)."""
    from samai.console.core.paths import audit_log
    from tests.test_watch import fire

    serve = job("sh -c 'kill -9 $$'", name="serve", key="v", extra='role = "serve"')  # killed: retried
    policy = 'interval = 0.3\nrecover = ["restart_serve"]\nmax_recoveries = 2\nbackoff_s = 0'
    cfg = load(tmp_path, toml(workspace, serve, watch=policy))
    w = watcher(cfg, [json_receiver.url], [])
    task = await watching(w)
    try:
        await fire(cfg, "serve")
        await until(lambda: any("2 recoveries in the last hour" in r.body for r in json_receiver.got), timeout=120)
        await running(w, 10)
    finally:
        await stop(task)
    died = [t for t in json_receiver.titles() if t.startswith("samai: stage serve failed rc=137")]
    assert len(died) == 3, "\n".join(json_receiver.titles())  # the run fired, and each of the two restarts
    audit = [json.loads(line) for line in audit_log().read_text().splitlines()]
    restarts = [e for e in audit if e.get("via") == "by the watcher" and e.get("phase") == "intent"]
    assert [e["action"] for e in restarts] == ["restart", "restart"]

