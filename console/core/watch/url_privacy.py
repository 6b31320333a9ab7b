"""Which parts of a notification URL are private, as apprise itself knows them: each service's
plugin declares its private tokens (a Telegram bot token, a Pushbullet access token, a Gotify app
token, a password) and renders its URL with them hidden (`url(privacy=True)`). A URL given on the
command line, where every user of the machine sees it, may hold none."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any


def private_parts(url: str) -> tuple[str, ...]:
    """The names of the private parts a URL holds ("bot_token", "password"); () when it holds
    none, or when apprise cannot read it (the watcher refuses that URL when it makes its receivers)."""
    import apprise  # the watcher's alone: the TUI never imports it

    try:
        plugin = apprise.Apprise.instantiate(url)
    except Exception:  # a plugin's bug reading a URL is a URL not read
        return ()
    if plugin is None:
        return ()
    # A private token the plugin could not use is kept as its invalid_NAME (an integration key of the
    # wrong form): it was still written on the command line.
    names = tuple(name for name, spec in plugin.template_tokens.items() if spec.get("private") and any(
        _given(getattr(plugin, attr, None)) for attr in (spec.get("map_to") or name, f"invalid_{name}")))
    if names:
        return names
    if urllib.parse.urlsplit(url).path.strip("/") and _private_in_path(plugin):
        return ("a private part of its path",)  # read as something else (a path), but written where one goes
    try:  # a private part the plugin holds under another name: its URL shown with privacy differs
        hidden = plugin.url(privacy=True) != plugin.url(privacy=False)
    except Exception:
        hidden = True  # it could not say: taken as holding one
    return ("a private part",) if hidden else ()


def _private_in_path(plugin: Any) -> bool:
    """Whether one of the plugin's URL templates puts a private token after its host (in the path)."""
    private = {name for name, spec in plugin.template_tokens.items() if spec.get("private")}
    for template in getattr(plugin, "templates", ()):
        rest = str(template).split("://", 1)[-1]
        after_host = rest.split("{host}", 1)[1] if "{host}" in rest else ""
        if private & set(re.findall(r"{(\w+)}", after_host)):
            return True
    return False


def _given(value: Any) -> bool:
    """Whether a plugin's attribute holds a value from the URL (a token, a password, a list of them)."""
    if isinstance(value, (str, bytes, list, tuple, set, dict)):
        return bool(value)
    return value is not None and not isinstance(value, bool)
