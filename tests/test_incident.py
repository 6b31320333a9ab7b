"""`samai-console incident --out FILE` and `replay FILE`: one bounded file with the timeline, the
snapshot, the logs' ends, the findings and the config; never a secret (tokens in the config, the
environment, a stage's command, its log); opened read-only in a fresh HOME, where no box is."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core.incident import MAX_LINES, NotABundle, read_bundle
from samai.widgets.logview import LogView
from samai.widgets.stages import StagesBar
from tests.helpers import pilot_until, run_cli, wait_for

TOKEN = "hf_" + "Zq8" * 12  # a Hub token's shape
PASSWORD = "pw-" + "x7" * 10
API_KEY = "sk-" + "Q9" * 20
# The credentials of notification URLs, by where each service keeps them (no shape of their own).
NOTIFY_SECRETS = {"tgram://123456789:{}/98765": "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
                  "discord://4174216298/{}": "JHMHI8qBe7bk2ZwO5U711o3dV_js",
                  "slack://T1JJ3T3L2/A1BRTD4JD/{}/#ops": "TIiajkdnlazkcOXrIdevi7FQ",
                  "gotify://gotify.example.com/{}": "AbCdEf1234567",
                  "pover://uQiRzpo4DXghDmr9QzzfQu27cmVRsG@{}": "azGDORePK8gMaC0QOYAMyEEuzJnyUi",
                  "ntfy://{}": "opsTopic4711", "mailto://op:{}@mail.example.com": "Pw5x9"}


NOTIFY_URLS = ", ".join(f'"{url.format(secret)}"' for url, secret in NOTIFY_SECRETS.items())
PUSHOVER_USER = "uQiRzpo4DXghDmr9QzzfQu27cmVRsG"
SAID = " ".join([*NOTIFY_SECRETS.values(), PUSHOVER_USER])  # what the stage prints: its log holds them too


def _config(tmp_path: Path, workspace: Path) -> Path:
    f = tmp_path / "incident.toml"
    f.write_text(f'[target]\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 f'[notify]\nurls = ["mailto://op:{PASSWORD}@mail.example.com", {NOTIFY_URLS}]\n'
                 f'[stages.job]\nkey = "j"\n'
                 f'command = "echo JOB_UP; echo using {TOKEN} {SAID}; for i in $(seq 1 400); do echo line $i; done; '
                 f'{sys.executable} -c \'import time; time.sleep(60)\' --token {TOKEN}"\n'
                 f'env = {{ HF_TOKEN = "{TOKEN}", OPENAI_API_KEY = "{API_KEY}" }}\n'
                 'markers = [{ name = "JOB_UP" }]\n')
    return f


def test_a_bundle_holds_the_incident_and_no_secret_and_replays_in_a_fresh_home(tmp_path: Path,
                                                                                workspace: Path) -> None:
    cfg = _config(tmp_path, workspace)
    env = {"SAMAI_NOTIFY_URLS": f"json://hook.example.com/?token={TOKEN}"}
    assert run_cli("--config", str(cfg), "fire", "job", "--yes", env=env).returncode == 0
    log = workspace / "logs" / "job.log"
    wait_for(lambda: "line 400" in log.read_text(), timeout=30)
    out = tmp_path / "incident.json"
    made = run_cli("--config", str(cfg), "incident", "--out", str(out), env=env)
    run_cli("--config", str(cfg), "stop", "job", "--yes")
    assert made.returncode == 0, made.stderr
    text = out.read_text()
    for secret in (TOKEN, PASSWORD, API_KEY, *NOTIFY_SECRETS.values(), PUSHOVER_USER):
        assert secret not in text, secret
    bundle = json.loads(text)
    assert bundle["config"]["notify"]["urls"][:3] == ["mailto://***", "tgram://***", "discord://***"]
    assert bundle["format"] == "samai-incident/1" and any(e["text"] == "JOB_UP" for e in bundle["timeline"])
    assert len(bundle["logs"]["job"].splitlines()) == MAX_LINES and "line 400" in bundle["logs"]["job"]
    assert any(e["kind"] == "started" and e["stage"] == "job" for e in bundle["timeline"])
    assert any(e["source"] == "audit" and e["kind"] == "fire" for e in bundle["timeline"])
    assert any("--token" in (p["argv"] or []) for p in bundle["probe"]["processes"])  # its value masked
    assert bundle["config"]["stages"]["job"]["key"] == "j" and out.stat().st_size < 4 << 20
    assert bundle["config"]["stages"]["job"]["env"] == {"HF_TOKEN": "***", "OPENAI_API_KEY": "***"}


async def test_the_bundle_opens_read_only_with_no_box(tmp_path: Path, workspace: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(tmp_path, workspace)
    assert run_cli("--config", str(cfg), "fire", "job", "--yes").returncode == 0
    wait_for(lambda: "line 400" in (workspace / "logs" / "job.log").read_text(), timeout=30)
    out = tmp_path / "incident.json"
    assert run_cli("--config", str(cfg), "incident", "--out", str(out)).returncode == 0
    run_cli("--config", str(cfg), "stop", "job", "--yes")
    fresh = tmp_path / "elsewhere"
    fresh.mkdir()
    monkeypatch.setenv("HOME", str(fresh))  # another machine: no config, no audit log, no box
    for name in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    os.rename(workspace, tmp_path / "gone")  # nothing of the box is left to read
    bundle = read_bundle(out)
    app = SamaiApp(bundle.config, readonly=True, poll=False, clock=lambda: bundle.made_at, recording=bundle.data)
    async with app.run_test(size=(150, 48)) as pilot:
        await pilot_until(pilot, lambda: "job" in str(app.box_screen.query_one(StagesBar).render()))
        assert "running" in str(app.box_screen.query_one(StagesBar).render())
        log = app.box_screen.query_one(LogView)
        await pilot_until(pilot, lambda: any("line 400" in line for line in log.lines))
        assert app.readonly


def test_what_replay_refuses(tmp_path: Path) -> None:
    for content, said in ((b"\xff\x00", "not JSON"), (b"[]", "not an incident bundle"),
                          (json.dumps({"format": "samai-incident/1"}).encode(), "without its snapshot")):
        (tmp_path / "b.json").write_bytes(content)
        with pytest.raises(NotABundle, match=said):
            read_bundle(tmp_path / "b.json")
    r = run_cli("replay", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "missing.json" in r.stderr


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                max_size=4), max_leaves=20)


@given(st.dictionaries(st.sampled_from(["config", "workspace", "made_at", "timeline", "x"]), JSON),
       st.dictionaries(st.sampled_from(["stages", "workspace", "target", "ui", "serve", "train"]), JSON),
       st.dictionaries(st.sampled_from(["processes", "states", "disks", "time", "listeners"]), JSON))
@settings(max_examples=200, deadline=None)
def test_any_bundle_file_opens_or_is_refused_by_name(tmp_path_factory, extra, tables, probe) -> None:
    """A bundle is a file anyone may hand over: what it holds is read as untrusted, never a crash."""
    from samai.console.replay import recorded_snapshot
    from samai.remote.follow import LogFollower

    path = tmp_path_factory.mktemp("b") / "b.json"
    recorded = {"time": 1.0, "host": "h", "boot_time": 1, "disks": [], "processes": [], "listeners": [], "states": []}
    for raw in (probe, {**recorded, **probe}):
        path.write_text(json.dumps({**extra, "format": "samai-incident/1", "probe": raw, "config": tables,
                                    "logs": {"job": "x\n", "train": 7, "eval": ["no"]}}))
        try:
            bundle = read_bundle(path)
        except NotABundle as e:
            assert "its snapshot cannot be read" in str(e)
            continue
        cfg = bundle.config  # a config that does not read is the tiny pipeline's
        assert isinstance(cfg.stages, tuple) and isinstance(bundle.made_at, float)
        recorded_snapshot(bundle.data, [LogFollower(f"/ws/logs/{name}.log") for name in ("job", "train", "eval")])
