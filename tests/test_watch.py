"""The headless watcher against real stages on this machine and real receivers on loopback
(tests/receivers.py): what each receiver gets, once; resolutions; acknowledgements; the cap; a
receiver that is down; an outage of a real gateway; secrets kept out of every log, output and
process listing; two watchers sending once; --once for cron; recovery by policy."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from samai.console.core import config
from samai.console.core.actions import Actions, Decision
from samai.console.core.audit import AuditLog
from samai.console.core.connect import open_box
from samai.console.core.paths import audit_log
from samai.console.core.watch.sender import Sender, receivers
from samai.console.core.watch.trust import contents
from samai.console.core.watch.watcher import BoxWatcher, Identity, watch
from tests.helpers import run_cli, unavailable_here, until, wait_for
from tests.receivers import PASSWORD, HttpReceiver, SmtpReceiver, free_port

pytestmark = pytest.mark.slow

FAILS_UNTIL_OK = 'test -f ok || { echo "CUDA error: an illegal memory access"; exit 3; }'


def toml(workspace: Path, stages: str, **sections: str) -> str:
    extra = "".join(f"\n[{name}]\n{body}\n" for name, body in sections.items())
    return f'pipeline = "watched"\n[workspace]\npath = "{workspace}"\n{stages}{extra}'


def job(command: str, name: str = "job", key: str = "j", extra: str = "") -> str:
    return f"[stages.{name}]\nkey = \"{key}\"\ncommand = '''{command}'''\n{extra}\n"


def load(tmp_path: Path, text: str) -> config.Config:
    path = tmp_path / "samai.toml"
    path.write_text(text)
    return config.load(str(path))


def watcher(cfg: config.Config, urls: list[str], lines: list[str], *, ident: str = "w1",
            retry: tuple[float, ...] = (0.2, 0.2, 0.2)) -> BoxWatcher:
    sender = Sender(receivers(urls), lines.append, retry_s=retry)
    cfg = replace(cfg, target=replace(cfg.target, poll_interval=cfg.watch.interval))
    return BoxWatcher("", cfg, open_box, sender, Identity(ident, "op@watchhost", "watchhost"), say=lines.append)


async def fire(cfg: config.Config, stage: str) -> None:
    async def yes(plan):
        return Decision.override(plan, "test") if plan.blocked else Decision.confirmed(plan, "test")

    box = open_box(cfg)
    try:
        outcome = await Actions(box, cfg, AuditLog(audit_log()), readonly=False, confirm=yes).fire(stage)
    finally:
        await box.close()
    assert outcome.status in ("ok", "done", "failed"), outcome.message  # a chain that ends at once is still fired


async def running(w: BoxWatcher, polls: int = 2) -> None:
    """A few more polls of the watcher done (what it saw is folded in)."""
    target = w.polls + polls
    await until(lambda: w.polls >= target, timeout=30)


async def test_a_failed_stage_reaches_each_receiver_once_with_its_cause_then_its_resolution(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver, ntfy_receiver: HttpReceiver,
        smtp_receiver: SmtpReceiver) -> None:
    cfg = load(tmp_path, toml(workspace, job("sleep 1; " + FAILS_UNTIL_OK), watch="interval = 0.3"))
    lines: list[str] = []
    w = watcher(cfg, [json_receiver.url, ntfy_receiver.url, smtp_receiver.url], lines)
    task = asyncio.ensure_future(watch([w]))
    try:
        await running(w)
        await fire(cfg, "job")
        inboxes = (json_receiver, ntfy_receiver, smtp_receiver)
        await until(lambda: all(r.got for r in inboxes), timeout=30)
        for r in inboxes:
            [got] = r.got
            assert got.title == "samai: stage job failed rc=3: CUDA error: an illegal memory access", got.title
            assert "stage: job" in got.body and "press x: restart job" in got.body
        assert json_receiver.got[0].raw["type"] == "failure"
        await running(w, 5)
        assert [len(r.got) for r in inboxes] == [1, 1, 1]  # once, however many polls see it
        (workspace / "ok").write_text("")
        await fire(cfg, "job")  # a new run: the death's alert resolves
        await until(lambda: all(len(r.got) == 2 for r in inboxes), timeout=30)
        for r in inboxes:
            assert r.got[1].title == "samai: resolved: stage job failed rc=3: CUDA error: an illegal memory access"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not any(PASSWORD in line for line in lines)


async def test_an_acknowledged_alert_is_not_repeated(tmp_path: Path, workspace: Path,
                                                     json_receiver: HttpReceiver) -> None:
    cfg = load(tmp_path, toml(workspace, job("sleep 1; exit 4"), watch="interval = 0.3", notify="repeat_after = 1"))
    lines: list[str] = []
    w = watcher(cfg, [json_receiver.url], lines)
    task = asyncio.ensure_future(watch([w]))
    try:
        await running(w)
        await fire(cfg, "job")
        await until(lambda: len(json_receiver.got) >= 2, timeout=30)  # the alert, then its repeat
        assert json_receiver.got[1].title.startswith("samai: still active: stage job failed rc=4")
        from samai.console.core.watch.policy import alert_identity

        [alert] = [a for a in w.state.active_alerts() if a.stage == "job"]
        box = open_box(cfg)
        try:
            await box.acknowledge([alert_identity(alert)], "op@laptop", {})
        finally:
            await box.close()
        await running(w, 2)
        seen = len(json_receiver.got)
        await asyncio.sleep(2.5)  # more than two repeat_after: it would have repeated twice
        await running(w, 2)
        assert len(json_receiver.got) == seen
        # anyone on the box can write an acknowledgement: each is said in the watcher's log
        assert f"acknowledged on the box by op@laptop: {alert_identity(alert)}" in lines, lines
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_cap_holds_under_an_alert_storm(tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    words = " ".join(f"x{c}" for c in "abcdefghijklmnopqrstuvwxyz")
    storm = f'for w in {words}; do echo "FATAL $w"; done; sleep 30'
    markers = '[[stages.job.markers]]\nname = "fatal"\npattern = "FATAL"\nseverity = "error"\n'
    cfg = load(tmp_path, toml(workspace, job(storm, extra=markers), watch="interval = 0.3",
                              notify="max_per_hour = 5"))
    w = watcher(cfg, [json_receiver.url], [])
    task = asyncio.ensure_future(watch([w]))
    try:
        await running(w)
        await fire(cfg, "job")
        await until(lambda: len(json_receiver.got) >= 6, timeout=30)
        await running(w, 5)
        titles = json_receiver.titles()
        assert len(titles) == 6 and titles[-1] == "samai: notifications held back", titles
        assert w.policy.held >= 20  # the rest of the storm, counted for the summary
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_receiver_that_is_down_is_retried_and_the_watcher_lives_on(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    json_receiver.fail_next = 2
    down = f"json://127.0.0.1:{free_port()}/nobody"  # nothing listens there at all
    cfg = load(tmp_path, toml(workspace, job("sleep 1; exit 5"), watch="interval = 0.3"))
    lines: list[str] = []
    w = watcher(cfg, [down, json_receiver.url], lines)
    task = asyncio.ensure_future(watch([w]))
    try:
        await running(w)
        await fire(cfg, "job")
        await until(lambda: json_receiver.got, timeout=30)
        assert json_receiver.failed == 2 and len(json_receiver.got) == 1
        await until(lambda: w.sender.unsent >= 1, timeout=30)  # the dead one, after its last retry
        assert any("JSON #1: not sent after 4 tries" in line for line in lines), lines
        polls = w.polls
        await running(w, 3)
        assert not task.done() and w.polls > polls
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _gateway(port: int, home: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "samai.console", "envelope-server", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=home)
    assert proc.stdout is not None and proc.stdout.readline().startswith("listening on http://")
    return proc


async def test_a_box_unreachable_and_back_sends_exactly_two_messages(
        tmp_path: Path, json_receiver: HttpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAMAI_ENVELOPE_TOKEN", "watch-test-token")
    home, port = tmp_path / "gw", free_port()
    home.mkdir()
    gateway = _gateway(port, home)
    text = toml(tmp_path / "gw-ws", job("true"), watch="interval = 0.3\nunreachable_after = 1.5")
    text = text.replace("[workspace]", f'[target]\nurl = "envelope+http://127.0.0.1:{port}"\ntimeout = 3\n'
                                       f'connect_timeout = 1\n[workspace]')
    cfg = load(tmp_path, text)
    w = watcher(cfg, [json_receiver.url], [])
    task = asyncio.ensure_future(watch([w]))
    try:
        await running(w)
        gateway.terminate()
        gateway.wait(10)
        await until(lambda: json_receiver.got, timeout=60)
        assert json_receiver.titles() == ["samai box: unreachable for 2 s"] or \
            json_receiver.titles()[0].startswith("samai box: unreachable for")
        gateway = _gateway(port, home)
        await until(lambda: len(json_receiver.got) >= 2, timeout=60)
        await running(w, 4)
        titles = json_receiver.titles()
        assert len(titles) == 2 and titles[1] == "samai box: reachable again", titles
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gateway.terminate()
        gateway.wait(10)


async def test_two_watchers_of_one_box_send_once(tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    cfg = load(tmp_path, toml(workspace, job("sleep 1; exit 6"), watch="interval = 0.3"))
    first = watcher(cfg, [json_receiver.url], [], ident="one")
    second = watcher(cfg, [json_receiver.url], [], ident="two")
    task = asyncio.ensure_future(watch([first, second]))
    try:
        await running(first)
        await running(second)
        assert first.leading != second.leading
        await fire(cfg, "job")
        await until(lambda: json_receiver.got, timeout=30)
        await running(first, 5)
        assert len(json_receiver.got) == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_the_cli_watcher_keeps_its_secrets_out_of_its_output_the_audit_log_and_ps(
        tmp_path: Path, workspace: Path, ntfy_receiver: HttpReceiver, smtp_receiver: SmtpReceiver) -> None:
    stage = job("sleep 2; env > env-seen.txt; exit 7")
    path = tmp_path / "samai.toml"
    path.write_text(toml(workspace, stage, watch="interval = 0.3",
                         notify=f'urls = ["{ntfy_receiver.url}"]\nurls_env = "WATCH_URLS"'))
    env = {**os.environ, "WATCH_URLS": smtp_receiver.url}
    proc = subprocess.Popen([sys.executable, "-m", "samai.console", "--config", str(path), "watch"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(0)  # the watcher starts while the stage is fired
        fired = run_cli("--config", str(path), "fire", "job", "--yes")
        assert fired.returncode in (0, 1), fired.stderr
        deadline = time.monotonic() + 60
        while not (ntfy_receiver.got and smtp_receiver.got) and time.monotonic() < deadline:
            time.sleep(0.1)
        listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            cmdline = f.read().decode()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert ntfy_receiver.got and smtp_receiver.got, out
    assert smtp_receiver.got[0].title.startswith("samai: stage job failed rc=7")
    assert "receivers: ntfy #1, E-Mail #2" in out or "receivers: Ntfy #1" in out or "#2" in out, out
    assert PASSWORD not in out and PASSWORD not in listing and PASSWORD not in cmdline
    audit = audit_log()
    assert not audit.exists() or PASSWORD not in audit.read_text()
    assert PASSWORD not in (workspace / "env-seen.txt").read_text()  # the stage never inherits the variable
    shared = workspace / ".samai" / "watch"
    assert all(PASSWORD not in p.read_text() for p in shared.glob("*.json"))


def test_a_notify_url_with_a_password_is_refused_on_the_command_line(tmp_path: Path, workspace: Path) -> None:
    path = tmp_path / "samai.toml"
    path.write_text(toml(workspace, job("true")))
    got = run_cli("--config", str(path), "watch", "--once", "--notify", f"ntfy://me:{PASSWORD}@127.0.0.1:9/t")
    assert got.returncode == 2 and "holds a password" in got.stderr and "[notify] urls" in got.stderr
    assert PASSWORD not in got.stderr + got.stdout


def test_watch_once_from_cron_tells_a_death_once(tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    path = tmp_path / "samai.toml"
    path.write_text(toml(workspace, job("sleep 8; exit 8"), notify=f'urls = ["{json_receiver.url}"]'))
    assert run_cli("--config", str(path), "fire", "job", "--yes").returncode == 0
    first = run_cli("--config", str(path), "watch", "--once")  # sees it running: leaves that in the ledger
    assert first.returncode == 0, first.stdout + first.stderr
    ledger = contents(json.loads((workspace / ".samai" / "watch" / "ledger.json").read_text()))
    assert ledger["statuses"]["job"] == "running"
    deadline = time.monotonic() + 30
    while "job" not in _rc_files(workspace) and time.monotonic() < deadline:
        time.sleep(0.2)
    second = run_cli("--config", str(path), "watch", "--once")
    assert second.returncode == 0, second.stdout
    assert json_receiver.titles() == ["samai: stage job failed rc=8"], second.stdout
    third = run_cli("--config", str(path), "watch", "--once")
    assert third.returncode == 0 and len(json_receiver.got) == 1, third.stdout


def _rc_files(workspace: Path) -> set[str]:
    return {p.stem for p in (workspace / ".samai" / "state").glob("*.rc")}


async def test_recovery_restarts_a_killed_server_by_the_watcher_and_the_cap_stops_a_death_loop(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    """A server killed from outside (SIGKILL) is restarted, with a backoff between two tries; past
    [watch] max_recoveries in the hour it is not, and the message says so."""
    serve = job("sleep 4; sh -c 'kill -9 $$'", name="serve", key="v", extra='role = "serve"')
    policy = 'interval = 0.3\nrecover = ["restart_serve"]\nmax_recoveries = 2\nbackoff_s = 1'
    cfg = load(tmp_path, toml(workspace, serve, watch=policy))
    lines: list[str] = []
    w = watcher(cfg, [json_receiver.url], lines)
    task = asyncio.ensure_future(watch([w]))
    try:
        await running(w)
        await fire(cfg, "serve")
        await until(lambda: any(t.startswith("samai: not recovered: serve") for t in json_receiver.titles()),
                    timeout=90)
        await running(w, 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    titles = json_receiver.titles()
    assert titles.count("samai: restarted serve") == 2, lines
    restarted = next(r for r in json_receiver.got if r.title == "samai: restarted serve")
    assert "why: an external kill: it came from outside the run" in restarted.body
    [capped] = [r for r in json_receiver.got if r.title.startswith("samai: not recovered")]
    assert "2 recoveries in the last hour" in capped.body and "max_recoveries" in capped.body
    audit = [json.loads(line) for line in audit_log().read_text().splitlines()]
    by_watcher = [e for e in audit if e.get("via") == "by the watcher" and e.get("phase") == "intent"]
    assert [e["action"] for e in by_watcher] == ["restart", "restart"]
    declined = [e for e in audit if e.get("result") == "declined" and e.get("stage") == "serve"]
    assert len(declined) == 1 and "max_recoveries" in declined[0]["message"] and declined[0]["cause"] == "signal"


class Said(list):
    """A watcher's log kept and printed as it comes, with the time (a test that fails shows it)."""

    def append(self, line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} watcher: {line}", flush=True)
        super().append(line)


async def test_a_server_that_dies_the_same_way_twice_is_not_restarted_again_and_says_why(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    """Its own exit (`bind failed`) twice in a row: a restart would die the same way (no crash loop)."""
    serve = job("sleep 4; echo 'bind failed'; exit 9", name="serve", key="v", extra='role = "serve"')
    policy = 'interval = 0.3\nrecover = ["restart_serve"]\nmax_recoveries = 5\nbackoff_s = 0'
    cfg = load(tmp_path, toml(workspace, serve, watch=policy))
    w = watcher(cfg, [json_receiver.url], Said())  # its log on stdout: shown if the test fails
    task = asyncio.ensure_future(watch([w]))
    try:
        await running(w)
        await fire(cfg, "serve")
        print("fired serve; the watcher's polls:", w.polls, flush=True)
        await until(lambda: any(t.startswith("samai: not recovered: serve") for t in json_receiver.titles()),
                    timeout=90)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert json_receiver.titles().count("samai: restarted serve") == 1
    [stopped] = [r for r in json_receiver.got if r.title.startswith("samai: not recovered")]
    assert "not restarted: exit twice in a row: it would die the same way again" in stopped.body


async def test_a_recovery_the_preflight_blocks_is_notified_not_forced(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    serve = job("sleep 1; exit 9", name="serve", key="v", extra='role = "serve"\nneeds = ["model"]')
    text = toml(workspace, serve, watch='interval = 0.3\nrecover = ["restart_serve"]')
    text += '\n[artifacts.model]\npath = "models/missing.gguf"\n'
    cfg = load(tmp_path, text)
    w = watcher(cfg, [json_receiver.url], [])
    task = asyncio.ensure_future(watch([w]))
    try:
        await running(w)
        await fire(cfg, "serve")  # fired over its preflight by the test; the watcher never overrides
        await until(lambda: any("not recovered" in t for t in json_receiver.titles()), timeout=60)
        await running(w, 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    [refused] = [r for r in json_receiver.got if "not recovered" in r.title]
    assert "the preflight blocks it" in refused.body and "needs model" in refused.body
    assert "samai: restarted serve" not in json_receiver.titles()
    runs = [r for r in (workspace / ".samai" / "state").glob("serve.json")]
    assert len(runs) == 1 and not any(e.get("via") == "by the watcher" and e.get("phase") == "intent"
                                      for e in map(json.loads, audit_log().read_text().splitlines()))


# ---------------------------------------------------------------- the README's lines, as written


def _readme_line(starts: str) -> str:
    readme = Path(__file__).parents[1] / "README.md"
    [line] = [line for line in readme.read_text("utf-8").splitlines() if line.startswith(starts)]
    return line


def _operator_home(tmp_path: Path, url: str) -> tuple[Path, dict[str, str]]:
    """A HOME with the URLs file the README names (plain VAR=value lines, as systemd reads them)
    and an environment whose PATH has samai-console."""
    home = tmp_path / "home"
    (home / ".config" / "samai").mkdir(parents=True)
    (home / ".config" / "samai" / "notify.env").write_text(f"SAMAI_NOTIFY_URLS={url}\n")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "HOME": str(home), "PATH": path}
    env.pop("SAMAI_NOTIFY_URLS", None)
    return home, env


def test_the_readmes_nohup_line_keeps_a_watcher_that_sends(tmp_path: Path, workspace: Path,
                                                           json_receiver: HttpReceiver) -> None:
    home, env = _operator_home(tmp_path, json_receiver.url)
    here = tmp_path / "op"
    here.mkdir()
    (here / "samai.toml").write_text(toml(workspace, job("sleep 2; exit 5"), watch="interval = 0.3"))
    line = _readme_line("nohup ")
    subprocess.run(["sh", "-c", f"{line} echo $! > watcher.pid"], cwd=here, env=env, check=True, timeout=30)
    pid = int((here / "watcher.pid").read_text())
    try:
        assert run_cli("--config", str(here / "samai.toml"), "fire", "job", "--yes").returncode in (0, 1)
        deadline = time.monotonic() + 60
        while not json_receiver.got and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", timeout=20)
    log = (here / "watch.log").read_text()
    assert json_receiver.titles()[:1] == ["samai: stage job failed rc=5"], log
    assert json_receiver.url not in log


def test_the_readmes_cron_line_tells_a_run_that_died_between_two_of_its_runs(
        tmp_path: Path, workspace: Path, json_receiver: HttpReceiver) -> None:
    """A run fired after one cron run and over before the next was never seen running: it is
    news all the same, once (the ledger keeps the box's time of the last look)."""
    home, env = _operator_home(tmp_path, json_receiver.url)
    (home / "samai.toml").write_text(toml(workspace, job("exit 6")))
    command = _readme_line("* * * * * ").split(" ", 5)[5]  # the five time fields, then what cron runs

    def cron() -> None:
        subprocess.run(["sh", "-c", command], env=env, check=True, timeout=60)

    cron()
    assert run_cli("--config", str(home / "samai.toml"), "fire", "job", "--yes").returncode in (0, 1)
    wait_for(lambda: "job" in _rc_files(workspace), timeout=30)
    cron()
    cron()
    assert json_receiver.titles() == ["samai: stage job failed rc=6"], (home / "watch.log").read_text()


def _readme_unit() -> str:
    readme = (Path(__file__).parents[1] / "README.md").read_text("utf-8")
    return readme[readme.index("[Unit]\n"):readme.index("WantedBy=default.target\n")] + "WantedBy=default.target\n"


def test_the_readmes_systemd_unit_verifies_and_its_command_sends(tmp_path: Path, workspace: Path,
                                                                 json_receiver: HttpReceiver) -> None:
    """systemd-analyze checks the unit as written (its keys, its ExecStart executable, %h being
    HOME); without a user session here, its ExecStart is then run as systemd would: %h
    expanded and the EnvironmentFile's VAR=value lines as its environment."""
    if not shutil.which("systemd-analyze"):
        unavailable_here("no systemd-analyze on this machine (.ci/run installs systemd)")
    home, env = _operator_home(tmp_path, json_receiver.url)
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "samai-console").symlink_to(Path(sys.executable).parent / "samai-console")
    (home / "samai.toml").write_text(toml(workspace, job("sleep 2; exit 4"), watch="interval = 0.3"))
    unit = tmp_path / "samai-watch.service"
    unit.write_text(_readme_unit())
    verified = subprocess.run(["systemd-analyze", "verify", str(unit)], env=env, capture_output=True, text=True,
                              timeout=60)
    assert verified.returncode == 0 and str(unit) not in verified.stderr, verified.stderr
    service = dict(line.split("=", 1) for line in _readme_unit().splitlines() if "=" in line)
    files = service["EnvironmentFile"].replace("%h", str(home))
    unit_env = {**env, **dict(line.split("=", 1) for line in Path(files).read_text().splitlines() if "=" in line)}
    argv = service["ExecStart"].replace("%h", str(home)).split()
    proc = subprocess.Popen(argv, env=unit_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert run_cli("--config", str(home / "samai.toml"), "fire", "job", "--yes").returncode in (0, 1)
        deadline = time.monotonic() + 60
        while not json_receiver.got and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert json_receiver.titles()[:1] == ["samai: stage job failed rc=4"], out
