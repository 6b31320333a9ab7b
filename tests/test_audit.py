"""The audit log fails closed and keeps no secrets: real CLI runs, real files, the real TUI.

An intent line is on disk (fsync'd) before the action runs and an outcome line with its id
follows; an audit log that cannot take the intent (a full device, a file size limit) means
nothing runs. Secrets in commands, alerts and saved logs are redacted, for the whole class of
each form (hypothesis makes the tokens)."""

from __future__ import annotations

import json
import resource
import string
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.audit import AuditLog
from samai.console.core.redact import redact
from tests.helpers import confirm_dialog, pilot_until, run_cli, wait_for

PIPELINE = """
[target]
poll_interval = 0.2
python = "{python}"
[workspace]
path = "{ws}"
[stages.hello]
key = "h"
command = "echo hello; sleep 39.625"
[stages.look]
key = "m"
command = "grep -c '\\"phase\\": \\"intent\\"' {audit} > seen; grep -c '\\"outcome\\"' {audit} >> seen; true"
"""


def _audit_path(isolated_dirs: Path) -> Path:
    return isolated_dirs / "xdg_state_home" / "samai" / "audit.jsonl"


@pytest.fixture
def cfg_file(tmp_path: Path, workspace: Path, isolated_dirs: Path) -> Path:
    f = tmp_path / "audit.toml"
    f.write_text(PIPELINE.format(ws=workspace, python=sys.executable, audit=_audit_path(isolated_dirs)))
    return f


def _nothing_ran(workspace: Path) -> None:
    assert not (workspace / ".samai" / "state" / "hello.json").exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if "39.625" in (p.info["cmdline"] or ())]


@pytest.mark.slow
def test_the_intent_is_on_disk_before_the_action_and_its_outcome_follows(cfg_file: Path, workspace: Path,
                                                                          isolated_dirs: Path) -> None:
    r = run_cli("--config", str(cfg_file), "fire", "look", "--yes")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: (workspace / "seen").exists() and len((workspace / "seen").read_text().split()) == 2)
    assert (workspace / "seen").read_text().split() == ["1", "0"]  # what the stage itself saw of the log
    intent, outcome = (json.loads(line) for line in _audit_path(isolated_dirs).read_text().splitlines())
    assert (intent["phase"], outcome["phase"]) == ("intent", "outcome") and intent["id"] == outcome["id"]
    assert intent["action"] == outcome["action"] == "fire" and intent["command"] == outcome["command"]
    assert "result" not in intent and outcome["result"] == "done" and outcome["confirmation"] == "--yes"


def test_an_audit_log_on_a_full_device_runs_nothing(cfg_file: Path, workspace: Path, isolated_dirs: Path) -> None:
    log = _audit_path(isolated_dirs)
    log.parent.mkdir(parents=True)
    log.symlink_to("/dev/full")  # opens, has "room", and every write fails with ENOSPC
    r = run_cli("--config", str(cfg_file), "fire", "hello", "--yes")
    assert r.returncode == 1 and "audit log" in r.stderr and "refused" in r.stderr, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("samai-console:")] == \
        [r.stderr.splitlines()[-1]]  # one line says why (after the preflight's checks)
    _nothing_ran(workspace)


def _size_limited(limit: int):
    def limit_file_size() -> None:  # in the child: writes past `limit` bytes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_file_size


@pytest.mark.slow
def test_an_audit_log_at_the_file_size_limit_runs_nothing(cfg_file: Path, workspace: Path,
                                                          isolated_dirs: Path) -> None:
    assert run_cli("--config", str(cfg_file), "snapshot").returncode == 0  # the box tools are in place
    log = _audit_path(isolated_dirs)
    log.parent.mkdir(parents=True, exist_ok=True)
    limit = 1 << 20
    line = json.dumps({"phase": "outcome", "note": "earlier"}) + "\n"
    log.write_text(line * (limit // len(line)) + "x" * (limit % len(line)))  # exactly at the limit
    r = subprocess.run([sys.executable, "-m", "samai.console", "--config", str(cfg_file), "fire", "hello", "--yes"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
                       preexec_fn=_size_limited(limit))
    assert r.returncode == 1 and "audit log" in r.stderr and "refused" in r.stderr, r.stderr
    assert log.stat().st_size == limit
    _nothing_ran(workspace)


def test_a_line_cut_short_is_not_glued_to_the_next(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.path.write_text('{"phase": "intent", "id": "a"}\n{"phase": "outc')  # a write the disk cut short
    entry_id = log.intent(action="fire", command="true")
    log.outcome(entry_id, action="fire", result="done")
    lines = log.path.read_text().splitlines()
    assert lines[1] == '{"phase": "outc'
    assert [json.loads(line)["phase"] for line in lines[2:]] == ["intent", "outcome"]


# ------------------------------------------------------------------ redaction

FUZZ = settings(max_examples=60, deadline=None, database=None)
# A value as a command line carries it unquoted: no blanks, quotes or shell separators.
VALUE_CHARS = string.ascii_letters + string.digits + "._~+/=-@%:!#^*?"
SWITCHES = ("true", "false", "yes", "no", "on", "off", "none", "null")  # no secret: `add_bos_token=true`
values = st.text(VALUE_CHARS, min_size=1, max_size=40).filter(
    lambda v: not v.startswith(("-", "$")) and v.lower() not in SWITCHES)
names = st.from_regex(r"[A-Z][A-Z0-9]{0,6}(_[A-Z0-9]{1,6}){0,2}", fullmatch=True)
SUFFIXES = ["_TOKEN", "_KEY", "_SECRET", "PASSWORD", "_PASSWORD", "PASSWD"]


@FUZZ
@given(prefix=names, suffix=st.sampled_from(SUFFIXES + ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY"]),
       value=values, quote=st.sampled_from(["", '"', "'"]))
def test_a_secret_env_assignment_is_redacted(prefix: str, suffix: str, value: str, quote: str) -> None:
    name = suffix if suffix.count("_") > 1 or suffix == "HF_TOKEN" else prefix + suffix
    rest = "MAX_TOKENS=3 MONKEY=1 python train.py --token $HF_TOKEN"  # no secrets: left as they are
    out = redact(f"env {name}={quote}{value}{quote} {rest}")
    assert out == f"env {name}=*** {rest}" and redact(out) == out


@FUZZ
@given(flag=st.sampled_from(["--password", "--token", "--api-key", "--hf-token", "--secret", "--access-key"]),
       value=values, sep=st.sampled_from([" ", "="]))
@example(flag="--password", value=":", sep=" ")  # once read as `password:` with the next flag as its value
def test_a_secret_flag_is_redacted(flag: str, value: str, sep: str) -> None:
    rest = "--max-tokens 2048 --url http://127.0.0.1:8080 ssh://op@gpu-box-7"  # no secrets
    assert redact(f"push.py {flag}{sep}{value} {rest}") == f"push.py {flag}{sep}*** {rest}"


@FUZZ
@given(user=st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12),
       password=st.text(VALUE_CHARS.replace("/", "").replace("?", "").replace("#", ""), min_size=1, max_size=30),
       scheme=st.sampled_from(["https", "http", "git+https", "s3"]))
def test_url_credentials_are_redacted(user: str, password: str, scheme: str) -> None:
    text = f"git clone {scheme}://{user}:{password}@host.example/repo.git"
    assert redact(text) == f"git clone {scheme}://{user}:***@host.example/repo.git"


@FUZZ
@given(token=st.text(string.ascii_letters + string.digits + "._~+/=-", min_size=8, max_size=60),
       scheme=st.sampled_from(["Bearer", "bearer", "Basic", "token"]))
def test_an_authorization_header_is_redacted(token: str, scheme: str) -> None:
    text = f'curl -H "Authorization: {scheme} {token}" https://host/v1'
    assert redact(text) == f'curl -H "Authorization: {scheme} ***" https://host/v1'
    assert redact(f"sent Bearer {token} upstream") == "sent Bearer *** upstream"


@FUZZ
@given(body=st.text(string.ascii_letters + string.digits + "_", min_size=20, max_size=40),
       prefix=st.sampled_from(["hf_", "ghp_", "github_pat_"]), before=st.sampled_from(["using ", "(", "'", "\n"]))
def test_a_token_known_by_its_prefix_is_redacted_wherever_it_stands(body: str, prefix: str, before: str) -> None:
    assert redact(f"{before}{prefix}{body} for the upload") == f"{before}{prefix}*** for the upload"


# Long runs that a pattern starting at every position would take quadratic time over (the
# suite's per-test timeout is what catches one that does).
@pytest.mark.slow
@example(text="_" * 200_000, value="v")
@example(text="a." * 100_000, value="v")
@example(text="-" * 200_000, value="v")
@example(text="a_" * 100_000, value="v")
@example(text="x://y:" * 30_000, value="v")
@example(text="--token" + " " * 100_000 + "-", value="v")
@example(text="?" + "a-" * 100_000, value="v")  # a query string's parameter name
@example(text="&X-Amz-" * 40_000, value="v")
@example(text="%26X-Amz-Signature%3D" + "%2" * 60_000, value="v")
@example(text="Authorization: " * 30_000, value="v")
@example(text="sk-" * 70_000, value="v")
@example(text="eyJa." * 50_000 + "eyJ" + "a" * 100_000, value="v")
@example(text="-----BEGIN PRIVATE KEY-----" * 8_000, value="v")
@example(text="-----BEGIN RSA PRIVATE KEY-----" + "A" * 200_000, value="v")
@example(text="login " * 40_000, value="v")
@example(text="curl " + "-u a:" * 40_000, value="v")  # the tools' flags: a pass over the words
@example(text='sh -c "curl -u ' * 20_000, value="v")
@example(text="'" + '"' * 100_000, value="v")
@example(text="mysql " * 40_000 + "-p", value="v")
@example(text="Cookie: " * 30_000, value="v")
@FUZZ
@given(text=st.text(max_size=300), value=values)
def test_any_text_redacts_without_error_and_stays_redacted(text: str, value: str) -> None:
    out = redact(f"{text}\nAWS_SECRET_ACCESS_KEY={value}\n")
    assert out.endswith("\nAWS_SECRET_ACCESS_KEY=***\n") and redact(out) == out


@pytest.mark.slow
def test_secrets_in_a_command_never_reach_the_audit_log(tmp_path: Path, workspace: Path, isolated_dirs) -> None:
    secrets = ["hf_Abcdefghijklmnopqrstu12", "wandb0123456789", "AKIAsecretsecret", "hunter2pass", "tok3n-value",
               "k3y-value", "s3cr3tpass", "eyJbearer.token.value"]
    command = (f"HF_TOKEN={secrets[0]} WANDB_API_KEY={secrets[1]} AWS_SECRET_ACCESS_KEY={secrets[2]} true "
               f"--password {secrets[3]} --token={secrets[4]} --api-key {secrets[5]} "
               f"https://op:{secrets[6]}@host/x 'Authorization: Bearer {secrets[7]}'")
    f = tmp_path / "s.toml"
    f.write_text(f'[workspace]\npath = "{workspace}"\n[stages.push]\nkey = "p"\ncommand = "{command}"\n'
                 f'env = {{ DB_PASSWORD = "{secrets[3]}" }}\n')
    r = run_cli("--config", str(f), "fire", "push", "--yes")
    assert r.returncode == 0, r.stderr
    text = _audit_path(isolated_dirs).read_text()
    assert len(text.splitlines()) == 2 and "HF_TOKEN=***" in text
    assert not [s for s in secrets if s in text]


@pytest.mark.slow
async def test_alerts_and_saved_logs_keep_no_secrets(tmp_path: Path, workspace: Path, isolated_dirs) -> None:
    from samai.console.app import SamaiApp
    from samai.console.screens.dialogs import ConfirmDialog
    from samai.widgets.logview import LogView

    secret = "hf_SecretSecretSecret0123456789"
    f = tmp_path / "leak.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\npython = "{sys.executable}"\n[workspace]\npath = "{workspace}"\n'
                 f'[stages.leak]\nkey = "j"\ncommand = "echo BAD_THING HF_TOKEN={secret} --password hunter2pass; '
                 'sleep 30"\nmarkers = [{ name = "BAD_THING", severity = "error" }]\n')
    app = SamaiApp(config.load(f))
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot_until(pilot, lambda: app.state.snapshot)
        await pilot.press("j")
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.focused)
        await confirm_dialog(pilot)
        await pilot_until(pilot, lambda: any("BAD_THING" in a.text for a in app.state.alerts))
        alert = next(a for a in app.state.alerts if "BAD_THING" in a.text)
        assert "HF_TOKEN=***" in alert.text and "--password ***" in alert.text
        assert not any(secret in a.text or "hunter2pass" in a.text for a in app.state.alerts)
        assert secret not in str(app.box_screen.query_one("#alerts").render())

        log = app.box_screen.query_one(LogView)
        # shown as it is, on the operator's screen
        await pilot_until(pilot, lambda: any(secret in line for line in log.lines))
        await pilot_until(pilot, lambda: not app.busy)
        log.focus()
        await pilot_until(pilot, lambda: app.focused is log)
        await pilot.press("ctrl+s")
        folder = isolated_dirs / "xdg_state_home" / "samai" / "saved-logs"
        await pilot_until(pilot, lambda: folder.exists() and list(folder.glob("*.log")))
        (saved,) = folder.glob("*.log")
        await pilot_until(pilot, lambda: "BAD_THING" in saved.read_text())
        text = saved.read_text()
        assert "HF_TOKEN=***" in text and secret not in text and "hunter2pass" not in text
        await app.box.stop("leak", grace=1)
