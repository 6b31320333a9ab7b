"""What the watchers sent, on the timeline (issue 47): a real watcher of the local box sends to a
real receiver on loopback (a death, its recovery by policy, the death's resolution), and then
`samai-console timeline` (text and --json) and the TUI's T list each of those messages, from the
ledger the watcher left on the box; the audit line of its recovery names the watcher, not a uid.
The ledger is box input like the rest: anyone may write it, and its text stays inert."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from textual.widgets import DataTable

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.connect import open_box
from samai.console.core.paths import audit_log
from samai.console.core.timeline import NOT_SHOWN, ledger_events
from samai.console.core.watch.ledger import MAX_TOLD, Told, sealed_ledger
from samai.console.core.watch.sender import Sender, receivers
from samai.console.core.watch.trust import Trust
from samai.console.core.watch.watcher import BoxWatcher, Identity, watch
from samai.console.screens.dialogs import TimelineScreen
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import pilot_until, run_cli, until, wait_for
from tests.receivers import HttpReceiver

pytestmark = pytest.mark.slow

HOSTILE = "\x1b]0;pwned\x07[b]bold[/b] \u202eevil"
# A serve stage whose first run dies; the run the watcher's recovery starts stays up.
SERVE = ("n=$(cat tries 2>/dev/null || echo 0); echo $((n + 1)) > tries; "
         "if [ \"$n\" -ge 1 ]; then echo SERVING; exec sleep 60; fi; sleep 1; echo 'bind failed'; exit 9")


def _config(tmp_path: Path, workspace: Path) -> Path:
    path = tmp_path / "samai.toml"
    path.write_text(f'pipeline = "watched"\n[workspace]\npath = "{workspace}"\n'
                    f"[stages.serve]\nkey = \"v\"\nrole = \"serve\"\ncommand = '''{SERVE}'''\n"
                    '[watch]\ninterval = 0.3\nrecover = ["restart_serve"]\n')
    return path


async def _fire(cfg: config.Config, stage: str) -> None:
    async def yes(plan):
        return Decision.confirmed(plan, "test")

    box = open_box(cfg)
    try:
        await Actions(box, cfg, AuditLog(audit_log()), readonly=False, confirm=yes).fire(stage)
    finally:
        await box.close()


async def test_the_timeline_lists_each_message_a_real_watcher_sent_and_its_recovery_names_the_watcher(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    path = _config(tmp_path, workspace)
    cfg = config.load(str(path))
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=cfg.watch.interval))
    lines: list[str] = []
    me = Identity("w1", "op@watchhost", "watchhost")
    w = BoxWatcher("", cfg, open_box, Sender(receivers([json_receiver.url]), lines.append, retry_s=(0.2,)), me,
                   say=lines.append)
    task = asyncio.ensure_future(watch([w]))
    try:
        await until(lambda: w.polls >= 2, timeout=30)
        await _fire(cfg, "serve")
        try:
            # Sent: the receiver took it, and the watcher knows it did (a watcher stopped within a
            # send never learns whether it went, and keeps no record of it).
            await until(lambda: any(t.kind == "resolved" for t in w.told), timeout=90)
        except AssertionError:  # what was sent and what the watcher said, for the one who reads the failure
            raise AssertionError((json_receiver.titles(), lines)) from None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # its last beat leaves the ledger on the box
    titles = json_receiver.titles()
    assert [t.split(":")[1].split()[0] for t in titles] == ["stage", "restarted", "resolved"], (titles, lines)

    r = run_cli("--config", str(path), "timeline", "--json")
    assert r.returncode == 0, r.stderr
    events = json.loads(r.stdout)["events"]
    sent = [e for e in events if e["source"] == "watcher"]
    assert [e["kind"] for e in sent] == ["alert", "recovery", "resolved"], sent
    assert [e["text"].split(" (to ")[0].split(": why:")[0].split(": after")[0] for e in sent] == titles
    assert ": why: exit, the first time" in sent[1]["text"], sent  # the recovery says the cause it acted on
    assert all(e["text"].endswith("(to JSON #1)") and e["stage"] == "serve" for e in sent), sent
    assert sent[0]["severity"] == "error" and "unverified" not in r.stdout  # this machine's key sealed it
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)

    actor = f"watcher op@watchhost (pid {os.getpid()})"
    [restart] = [e for e in events if e["source"] == "audit" and e["kind"] == "restart"]
    assert f"restart stage serve by {actor}: " in restart["text"], restart
    entries = [json.loads(line) for line in audit_log().read_text().splitlines()]
    by_watcher = [e for e in entries if e.get("via") == "by the watcher"]
    assert [e["phase"] for e in by_watcher] == ["intent", "outcome"] and {e["user"] for e in by_watcher} == {actor}

    text = run_cli("--config", str(path), "timeline").stdout
    said = [line for line in text.splitlines() if "watcher:serve" in line]
    assert [line.split()[3] for line in said] == ["alert", "recovery", "resolved"], text
    assert titles[1] in said[1] and f"by {actor}" in text and " by 0" not in text

    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    app = SamaiApp(replace(cfg, target=replace(cfg.target, poll_interval=0.2)), open_box=lambda _cfg: box)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot is not None)
        await pilot.press("T")
        screen = await pilot_until(pilot, lambda: isinstance(app.screen, TimelineScreen) and app.screen)
        shown = [e for e in screen.events if e.source == "watcher"]
        assert [(e.kind, e.text) for e in shown] == [(e["kind"], e["text"]) for e in sent]
        table = await pilot_until(pilot, lambda: screen.shown and screen.query_one(DataTable))
        rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
        listed = [row for row in rows if row[1] == "watcher:serve"]
        assert [row[2] for row in listed] == ["alert", "recovery", "resolved"] and titles[1] in listed[1][3], rows


def _ledger_on_box(workspace: Path, ledger: dict) -> None:
    folder = workspace / ".samai" / "watch"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ledger.json").write_text(json.dumps(ledger))


def test_a_ledger_anyone_wrote_is_shown_inert_and_said_to_be_unverified(tmp_path: Path, workspace: Path) -> None:
    path = _config(tmp_path, workspace)
    Trust.load()  # this machine has a watch key: the ledger is checked against it
    told = [{"at": 1_800_000_000 + i, "kind": kind, "severity": severity, "title": f"samai: {HOSTILE} {i}",
             "stage": HOSTILE, "detail": HOSTILE, "to": [HOSTILE, 7]}
            for i, (kind, severity) in enumerate([("alert", "error"), ("rm -rf", "fatal"), ("resolved", "info")])]
    _ledger_on_box(workspace, {"sent": {}, "told": told + [{"at": "soon"}, "x", {"at": 1e300}], "told_dropped": 5})
    r = run_cli("--config", str(path), "timeline", "--json")
    events = [e for e in json.loads(r.stdout)["events"] if e["source"] == "watcher"]
    assert [(e["kind"], e["severity"]) for e in events] == [(NOT_SHOWN, "warning"), ("alert", "error"),
                                                            ("sent", "info"), ("resolved", "info")]
    assert "5 earlier messages" in events[0]["text"]
    assert all("(unverified: the ledger not sealed)" in e["text"] for e in events[1:])
    text = run_cli("--config", str(path), "timeline").stdout
    assert text.count("(unverified: the ledger not sealed)") == 3
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text and "[b]bold[/b]" in text


@given(ledger=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                           lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
                               st.sampled_from(["told", "told_dropped", "sent", "at", "kind", "severity", "title",
                                                "stage", "detail", "to", "sealed", "data"]) | st.text(max_size=5),
                               inner, max_size=6), max_leaves=40))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_any_ledger_gives_events_without_raising(ledger: object) -> None:
    raw = ledger if isinstance(ledger, dict) else {"told": ledger}
    for unverified in ("", "not sealed"):
        for e in ledger_events(raw, unverified):
            assert e.source == "watcher" and isinstance(e.text, str) and e.severity in ("info", "warning", "error")
            json.dumps(e.to_json())


def test_a_sealed_ledger_keeps_the_newest_messages_and_counts_the_rest() -> None:
    told = [Told(1_800_000_000.0 + i, "alert", "error", "samai: x" * 40, "s", "d" * 300, ["JSON #1"])
            for i in range(MAX_TOLD + 50)]
    sealed = sealed_ledger(Trust.of(b"k" * 32), {}, {}, told, 3)
    events = ledger_events(sealed)
    assert events[0].kind == NOT_SHOWN and len(events) - 1 < MAX_TOLD + 50
    kept = len(events) - 1
    assert f"{MAX_TOLD + 50 - kept + 3:,} earlier messages" in events[0].text
    assert events[-1].time == told[-1].at  # the newest are kept


async def test_a_stop_decided_by_a_watcher_names_it_in_the_audit_log_and_the_stage_s_record(
        tmp_path: Path, workspace: Path) -> None:
    path = tmp_path / "samai.toml"
    path.write_text(f'[workspace]\npath = "{workspace}"\n[stages.job]\nkey = "j"\ncommand = "sleep 60"\n')
    cfg = config.load(str(path))
    await _fire(cfg, "job")
    actor = Identity("w1", "op@watchhost", "watchhost", pid=4242).actor

    async def by_the_watcher(plan):
        return Decision.confirmed(plan, "by the watcher", by=actor)

    box = Box(LocalTransport(), str(workspace), python=sys.executable)
    try:
        outcome = await Actions(box, cfg, AuditLog(audit_log()), readonly=False, confirm=by_the_watcher).stop("job")
        assert outcome.ok, outcome.message
        record = (await box.snapshot()).state("job")
    finally:
        await box.close()
    assert actor == "watcher op@watchhost (pid 4242)"
    assert record is not None and record.stopped_by == f"{actor} (stop)"
    stop = [json.loads(line) for line in audit_log().read_text().splitlines() if '"stop"' in line]
    assert [e["user"] for e in stop] == [actor, actor]


def test_what_each_cron_run_of_the_watcher_sent_stays_on_the_timeline(tmp_path: Path, workspace: Path,
                                                                      json_receiver: HttpReceiver) -> None:
    path = tmp_path / "samai.toml"
    path.write_text(f'[workspace]\npath = "{workspace}"\n'
                    "[stages.job]\nkey = \"j\"\ncommand = '''test -f ok && exit 0; sleep 3; exit 8'''\n"
                    f'[notify]\nurls = ["{json_receiver.url}"]\n')
    rc = workspace / ".samai" / "state" / "job.rc"

    def cron() -> None:
        r = run_cli("--config", str(path), "watch", "--once")
        assert r.returncode == 0, r.stdout + r.stderr

    assert run_cli("--config", str(path), "fire", "job", "--yes").returncode == 0
    cron()  # sees it running: the next run tells its end
    wait_for(rc.exists, timeout=30)
    cron()
    (workspace / "ok").write_text("")
    rc.unlink()
    assert run_cli("--config", str(path), "fire", "job", "--yes").returncode == 0
    wait_for(rc.exists, timeout=30)
    cron()
    assert json_receiver.titles() == ["samai: stage job failed rc=8", "samai: resolved: stage job failed rc=8"]
    r = run_cli("--config", str(path), "timeline", "--json")
    sent = [(e["kind"], e["text"]) for e in json.loads(r.stdout)["events"] if e["source"] == "watcher"]
    assert sent == [("alert", "samai: stage job failed rc=8 (to JSON #1)"),
                    ("resolved", "samai: resolved: stage job failed rc=8 (to JSON #1)")]
