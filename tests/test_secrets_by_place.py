"""Secrets by where the config keeps them, whatever their shape: every notification URL (a
Telegram bot token where a host would be, a Discord or Slack webhook's tokens, a Gotify app
token, a Pushover user key, an ntfy topic, a 5-letter mail password) and the value of every
variable a `*_env` key names (a target's token_env, notify's urls_env) never leave the console:
not in an incident bundle, not in the audit log, not in the watcher's log, not in a toast.
Random secrets placed in a real config; the exits are the real ones (a bundle made from a real
local box, the audit log's file, apprise's log through the watcher's handler, the TUI)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config, paths
from samai.console.core.audit import AuditLog
from samai.console.core.incident import make_bundle, write_bundle
from samai.console.core.secret_mask import SecretMask
from samai.console.core.watch.sender import route_apprise_log
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport
from tests.helpers import pilot_until, run_cli, wait_for

TOKEN_ENV, URLS_ENV = "PLACE_TEST_GATEWAY_TOKEN", "PLACE_TEST_NOTIFY_URLS"
# A token as services write them: letters and digits (a host-shaped one, with a dot, is a host).
TOKEN = st.text(st.sampled_from("abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789_-"), min_size=8,
                max_size=40).filter(lambda t: any(c.isdigit() for c in t) and any(c.isalpha() for c in t)
                                    and t[0] not in "-_")
PASSWORD5 = st.text(st.sampled_from("abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"), min_size=5,
                    max_size=5).filter(lambda t: any(c.isdigit() for c in t) and any(c.isalpha() for c in t))
# An environment value: anything printable on one line (a variable holds it whole).
ENV_VALUE = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, blacklist_categories=("Cc", "Cs")),
                    min_size=8, max_size=40).filter(lambda t: any(c.isalnum() for c in t) and "\\" not in t)


@st.composite
def secrets_in_place(draw) -> tuple[list[str], dict[str, str], list[str]]:
    """(the [notify] urls, the environment, every secret they hold)."""
    t = [draw(TOKEN, label=f"token {i}") for i in range(9)]
    pw = draw(PASSWORD5, label="mail password")
    urls = [f"tgram://123456789:{t[0]}/98765", f"discord://{t[1]}/{t[2]}", f"slack://{t[3]}/B0AAAAAAA/{t[4]}/#ops",
            f"gotify://gotify.example.com/{t[5]}", f"pover://{t[6]}@{t[7]}", f"ntfy://{t[8]}",
            f"mailto://op:{pw}@mail.example.com"]
    token, more = draw(ENV_VALUE, label="gateway token"), draw(TOKEN, label="url in the environment")
    env = {TOKEN_ENV: token, URLS_ENV: f"json://hook.example.com/{more}"}
    return urls, env, [*t, f"123456789:{t[0]}", pw, token, more]


def _config(folder: Path, workspace: Path, urls: list[str]) -> config.Config:
    path = folder / "samai.toml"
    listed = ", ".join(json.dumps(u) for u in urls)
    path.write_text(f'[target]\npython = "{sys.executable}"\ntoken_env = "{TOKEN_ENV}"\n'
                    f'[workspace]\npath = "{workspace}"\n'
                    f'[notify]\nurls = [{listed}]\nurls_env = "{URLS_ENV}"\n'
                    '[stages.job]\nkey = "j"\ncommand = "true"\n')
    return config.load(path)


def _texts(value) -> list[str]:
    """Every string in a JSON value, keys and values."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in _texts(v))]
    if isinstance(value, list):
        return [s for v in value for s in _texts(v)]
    return []


def _leaked(secrets: list[str], *texts: str) -> list[str]:
    return [s for s in secrets if any(s in t for t in texts)]


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("place")


@pytest.mark.slow  # a bundle from the real box at each example
@given(secrets_in_place())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_secret_the_config_keeps_reaches_a_bundle_the_audit_log_or_the_watchers_log(place: Path,
                                                                                        drawn) -> None:
    urls, env, secrets = drawn
    folder = Path(tempfile.mkdtemp(dir=place))  # each example its own (an example may be run again)
    workspace = folder / "ws"
    (workspace / "logs").mkdir(parents=True)
    cfg = _config(folder, workspace, urls)
    mask = SecretMask.of_config(cfg, env)
    said = " ".join(secrets)  # what a box, a log or an error may say: every secret, in every form
    (workspace / "logs" / "job.log").write_text(f"job: using {said}\nurls: {' '.join(urls)}\n"
                                                f"quoted: {json.dumps(said)}\n")
    assume(not _leaked(secrets, str(workspace)))

    # the audit log: each line masked as it is written (also a curl -sfu in a command)
    audit = AuditLog(folder / "audit.jsonl", mask)
    entry = audit.intent(action="fire", stage="job", command=f"curl -sfu op:{secrets[-1]} {urls[0]} # {said}",
                         target=urls[3])
    audit.outcome(entry, status="failed", error=f"the gateway refused {env[TOKEN_ENV]}: {said}")
    written = (folder / "audit.jsonl").read_text()
    assert _leaked(secrets, written, *(s for line in written.splitlines() for s in _texts(json.loads(line)))) == []

    # an incident bundle from the real box: its logs, its timeline (this audit log), findings, config
    async def bundle() -> dict:
        box = Box(LocalTransport(), str(workspace), python=sys.executable)
        try:
            return await make_bundle(box, cfg, folder / "audit.jsonl", since=None, mask=mask,
                                     findings=[{"text": f"finding {said}", "urls": urls}])
        finally:
            await box.close()

    content = asyncio.run(bundle())
    write_bundle(content, folder / "bundle.json")
    text = (folder / "bundle.json").read_text()
    assert _leaked(secrets, text, *_texts(json.loads(text))) == []
    assert "job: using" in text and content["config"]["notify"]["urls"][0] == "tgram://***"

    # the watcher's log: apprise's own records (a failed send names its URL) through the watcher's handler
    lines: list[str] = []
    log = logging.getLogger("apprise")
    kept = log.handlers, log.propagate, log.level
    try:
        route_apprise_log(mask, lines.append)
        log.warning("send to %s failed: %s", urls[1], said)
    finally:
        log.handlers, log.propagate = kept[:2]
        log.setLevel(kept[2])
    assert lines and _leaked(secrets, *lines) == []


def test_the_mask_of_a_config_is_made_of_its_places_not_of_every_word() -> None:
    """A part shorter than MIN_SECRET, a host by name, a query's keys and a URL's scheme stay readable."""
    cfg = config.from_raw({"notify": {"urls": ["ntfys://ntfy.sh/Top1cName?priority=high",
                                               "json://localhost:8080/hook"]}}, "(test)")
    mask = SecretMask.of_config(cfg, {})
    assert mask("posted to ntfy.sh topic Top1cName at priority high") == "posted to ntfy.sh topic *** at priority ***"
    assert mask("localhost:8080 answered") == "localhost:8080 answered"
    assert mask("ntfys://ntfy.sh/Top1cName?priority=high") == "***"


@pytest.mark.slow  # a Textual app
async def test_a_toast_never_shows_a_secret_the_config_keeps(tmp_path: Path, workspace: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "gw-Tok3n")
    cfg = _config(tmp_path, workspace, ["tgram://123456789:AAbbCC11ddEE/98765", "mailto://op:Pw5x9@mail.example.com"])
    app = SamaiApp(cfg, poll=False)
    async with app.run_test(size=(150, 45), notifications=True) as pilot:
        app.notify("the gateway said gw-Tok3n; telegram 123456789:AAbbCC11ddEE; mail Pw5x9", severity="error")
        toasts = await pilot_until(pilot, lambda: "\n".join(str(t.render()) for t in app.screen.query("Toast")))
        assert "the gateway said ***" in toasts
        assert _leaked(["gw-Tok3n", "AAbbCC11ddEE", "Pw5x9"], toasts) == []


@pytest.mark.slow  # a stage fired through the CLI, waited on
def test_a_failed_fire_on_the_command_line_says_and_audits_no_secret_the_config_keeps(tmp_path: Path,
                                                                                      workspace: Path) -> None:
    bot, gateway = "AAbbCC11ddEEff", "gw-Tok3nQx"
    path = tmp_path / "samai.toml"
    path.write_text(f'[target]\npython = "{sys.executable}"\ntoken_env = "{TOKEN_ENV}"\n'
                    f'[workspace]\npath = "{workspace}"\n[notify]\nurls = ["tgram://123456789:{bot}/98765"]\n'
                    f'[stages.job]\nkey = "j"\ncommand = "echo bot {bot}; echo gateway ${TOKEN_ENV}; exit 3"\n')
    fired = run_cli("--config", str(path), "fire", "job", "--yes", env={TOKEN_ENV: gateway})
    assert fired.returncode == 1 and "| bot ***" in fired.stderr and "| gateway ***" in fired.stderr, fired.stderr
    audit = paths.audit_log().read_text()
    assert '"fire"' in audit and _leaked([bot, gateway], fired.stdout, fired.stderr, audit) == []


@pytest.mark.slow  # a stage fired and watched through the CLI, a real receiver
def test_a_message_to_a_receiver_never_quotes_a_secret_the_config_keeps(tmp_path: Path, workspace: Path) -> None:
    """A stage that prints its gateway token and its notification URL's path token as it dies: the
    watcher's message quotes its last words, masked by the config's places."""
    from tests.receivers import HttpReceiver

    receiver = HttpReceiver("json")
    try:
        bot, gateway = "AAbbCC11ddEEff", "gw-Tok3nQx"  # the hook's token (its URL's path), the gateway's
        path = tmp_path / "samai.toml"
        path.write_text(f'[target]\npython = "{sys.executable}"\ntoken_env = "{TOKEN_ENV}"\n'
                        f'[workspace]\npath = "{workspace}"\n'
                        f'[notify]\nurls = ["{receiver.url}/{bot}"]\n'
                        "[stages.job]\nkey = \"j\"\n"
                        f"command = '''sleep 8; echo BOT {bot} gateway ${TOKEN_ENV}; "
                        f"echo 'Traceback (most recent call last):'; echo RuntimeError: {gateway}; exit 3'''\n"
                        'markers = [{ name = "BOT", severity = "error" }]\n')
        env = {TOKEN_ENV: gateway}
        assert run_cli("--config", str(path), "fire", "job", "--yes", env=env).returncode == 0
        seen = run_cli("--config", str(path), "watch", "--once", env=env)  # sees it running
        assert seen.returncode == 0, seen.stdout + seen.stderr
        wait_for(lambda: (workspace / ".samai" / "state" / "job.rc").exists(), timeout=60)
        told = run_cli("--config", str(path), "watch", "--once", env=env)
        assert told.returncode == 0, told.stdout + told.stderr
        said = " ".join(f"{r.title} {r.body} {json.dumps(r.raw)}" for r in receiver.got)
        assert "job failed rc=3" in said, said  # its death, with its last words
        assert _leaked([bot, gateway], said, seen.stdout, told.stdout, told.stderr) == [], said
    finally:
        receiver.close()
