"""`watch --notify URL` refuses a URL that holds what apprise itself keeps private for its service
(a Telegram bot token, a Pushbullet access token, a Gotify app token, a password...): a command
line is seen by every user of the machine. The class: every apprise plugin that declares a
private token, a URL built from each of its templates that carries one (each token drawn from the
plugin's own pattern for it), whenever apprise reads that URL. The refusal says why and never the
URL or its secret; a URL with nothing private is taken."""

from __future__ import annotations

import re
import warnings

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from samai.console.cli_watch import WatchUsage, notify_urls
from samai.console.core import config
from tests.helpers import run_cli

with warnings.catch_warnings():  # a plugin's module may warn at import (a deprecated stdlib module)
    warnings.simplefilter("ignore")
    import apprise
    from apprise.manager_plugins import NotificationManager

CFG = config.from_raw({}, "(test)")


def _schema(plugin) -> str | None:
    for attr in ("secure_protocol", "protocol"):
        value = getattr(plugin, attr, None)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, (list, tuple)) and value:
            return value[0]
    return None


def _private(plugin) -> set[str]:
    return {name for name, spec in plugin.template_tokens.items() if spec.get("private")}


# (plugin, its schema, the templates that carry a private token), for every plugin that has one
PLUGINS = sorted(((p, _schema(p), tuple(t for t in p.templates if _private(p) & set(re.findall(r"{(\w+)}", t))))
                  for p in NotificationManager().plugins() if _private(p) and _schema(p)),
                 key=lambda entry: entry[0].__name__)
PLUGINS = [entry for entry in PLUGINS if entry[2]]


def _token(name: str, spec: dict) -> st.SearchStrategy[str]:
    """A value for one of a template's tokens, as the plugin would take it."""
    kind = spec.get("type", "string")
    if kind.startswith("choice"):
        return st.sampled_from([str(v) for v in spec["values"]])
    if kind.startswith("int"):
        return st.integers(max(spec.get("min") or 1, 1), min(spec.get("max") or 65535, 65535)).map(str)
    if name == "host":
        return st.just("host.example.com")
    if name == "path":  # a path as a URL writes one: between slashes (glued to the host, it is the host)
        return st.sampled_from(["/", "/hooks/", "/a/b/"])
    regex = spec.get("regex")
    if regex:
        pattern, flags = regex if isinstance(regex, tuple) else (regex, "")
        return st.from_regex(re.compile(pattern, re.IGNORECASE if "i" in flags else 0), fullmatch=True) \
            .filter(lambda v: bool(v) and all(c.isalnum() or c in "-_.:" for c in v))
    return st.text(st.sampled_from("abcdefghjkmnpqrstuvwxyzABCDEFGHJKMNPQRSTUVWXYZ23456789"), min_size=12,
                   max_size=32)


@given(st.sampled_from(PLUGINS), st.data())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
def test_a_url_that_holds_what_apprise_keeps_private_is_refused_on_the_command_line(entry, data) -> None:
    plugin, schema, templates = entry
    template = data.draw(st.sampled_from(templates), label="template")
    values: dict[str, str] = {"schema": schema}
    for name in re.findall(r"{(\w+)}", template):
        if name != "schema":
            values[name] = data.draw(_token(name, plugin.template_tokens.get(name, {})), label=name)
    url = template.format(**values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assume(apprise.Apprise.instantiate(url) is not None)  # a URL apprise reads (it would send with it)
    with pytest.raises(WatchUsage) as refused:
        notify_urls(CFG, [url])
    said = str(refused.value)
    assert "--notify #1: it holds" in said and url not in said
    secrets = [values[name] for name in _private(plugin) & set(values) if len(values[name]) >= 4]
    assert [s for s in secrets if s in said] == []


def test_a_url_with_nothing_private_is_taken() -> None:
    for url in ("json://hook.example.com/alerts", "ntfys://ntfy.sh/alerts", "mailto://ops@example.com"):
        assert notify_urls(CFG, [url])[-1] == url


@pytest.mark.slow  # the CLI, as a user runs it
def test_the_command_line_says_why_in_one_line_and_never_the_secret() -> None:
    for url, secret in (("tgram://123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/12345", "AAHdqTcvCH1vGWJxfSeofSAs0K5"),
                        ("pbul://o.gn5kj6nfhv736I7jC3cj3QLRiyhgl98b", "gn5kj6nfhv736I7jC3cj3QLRiyhgl98b"),
                        ("gotify://gotify.example.com/AbCdEf12345", "AbCdEf12345")):
        got = run_cli("watch", "--once", "--notify", url)
        assert got.returncode == 2 and got.stderr.count("\n") == 1 and "apprise keeps private" in got.stderr, \
            got.stderr
        assert secret not in got.stderr + got.stdout
