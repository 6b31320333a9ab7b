"""The config's secrets, known by where the config keeps them, masked wherever a text leaves the
console (an incident bundle, the audit log, the watcher's log, a toast, an error).

redact() finds a secret by its shape (`HF_TOKEN=…`, `user:pass@`, `hf_…`); a secret the config
keeps may have no shape at all (a Telegram bot token as a URL's host, an ntfy topic, a 5-letter
password). So the mask also knows them by place:
- every notification URL ([notify] urls, and the ones in the variable `urls_env` names): the URL
  whole, and each of its parts (user, password, host unless it is a host name, path segments,
  query values, fragment);
- the value of every environment variable a `*_env` key names (each target's `token_env`,
  notify's `urls_env`);
- the value of a stage's env entry whose name is a secret's (HF_TOKEN).
Each also as it is written percent-encoded or inside a JSON string. A part shorter than
MIN_SECRET is left to redact(): masking it would mask that group of letters in every line."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from samai.console.core.redact import MASK, redact, secret_name

if TYPE_CHECKING:
    from samai.console.core.config import Config

MIN_SECRET = 4
# What lies between two of these in a text that is not a URL is one part.
_URL_SEPARATORS = re.compile(r"[/?#&=@:,;]+")
# A host by name (it has a dot, or is localhost), not a token standing where a host would.
_HOST_NAME = re.compile(r"^(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)$")


class SecretMask:
    """Masks the given secrets (and the notification URLs' parts) in a text, then redact()s it.
    SecretMask() knows no secret of its own: it is redact()."""

    def __init__(self, urls: Sequence[str] = (), values: Iterable[str] = ()) -> None:
        secrets = {v for v in values if len(v) >= MIN_SECRET}
        for url in urls:
            secrets |= set(url_secrets(url))
        forms = {form for s in secrets for form in _written_forms(s) if len(form) >= MIN_SECRET}
        # Longest first: a secret that holds another is masked whole.
        self._pattern = re.compile("|".join(re.escape(s) for s in sorted(forms, key=len, reverse=True))) \
            if forms else None

    @classmethod
    def of_config(cls, cfg: Config, environ: Mapping[str, str] | None = None,
                  urls: Sequence[str] = ()) -> SecretMask:
        """The mask of a config this console runs with (never a bundle's: its variables are not
        read), the environment's values of the variables it names included. urls: notification
        URLs read elsewhere (the watcher's, once it took its variable out of the environment)."""
        env = os.environ if environ is None else environ
        from_env = env.get(cfg.notify.urls_env, "")
        named = [env.get(name, "") for name in _env_names(cfg)]
        stage_secrets = [value for stage in cfg.stages for name, value in stage.env if secret_name(name)]
        return cls([*cfg.notify.urls, *split_urls(from_env), *urls], [*named, *stage_secrets])

    def __call__(self, text: str) -> str:
        text = self._exact(text)
        return self._exact(redact(text)) if self._pattern is not None else redact(text)

    def all(self, value: Any) -> Any:
        """Every string in a JSON-like value (dict values, lists, tuples, str) masked; the rest as it is."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.all(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.all(v) for v in value]
        return value

    def _exact(self, text: str) -> str:
        """The known secrets out, until none is left (a mask beside the rest of a secret could
        spell it again: each pass shortens the text, so this ends)."""
        if self._pattern is None:
            return text
        while True:
            masked = self._pattern.sub(MASK, text)
            if masked == text:
                return text
            text = masked


def split_urls(text: str) -> list[str]:
    """The URLs of a notification variable's value (space or comma separated)."""
    return [u for u in re.split(r"[\s,]+", text) if u]


def url_secrets(url: str) -> Iterator[str]:
    """A notification URL whole and each part of it a service may keep a credential in: the user
    info (user, password), the host unless it is a host name (a token stands there in tgram://,
    discord://, pover://, ntfy://TOPIC), each path segment, each query value, the fragment."""
    yield url
    _, sep, rest = url.partition("://")
    if not sep:
        yield from _URL_SEPARATORS.split(url)
        return
    rest, _, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        yield from (userinfo, *userinfo.split(":", 1))
    port = re.fullmatch(r"(.*):(\d{1,5})", hostport)
    host = port.group(1) if port else hostport
    if not _HOST_NAME.match(host):
        yield from (host, *host.split(":"))
    yield from path.split("/")
    yield from (value for _, value in urllib.parse.parse_qsl(query, keep_blank_values=True))
    yield fragment


def _written_forms(secret: str) -> set[str]:
    """A secret as a text may carry it: as it is, percent-encoded or decoded, inside a JSON string."""
    forms = {secret, urllib.parse.unquote(secret), urllib.parse.quote(secret, safe=""),
             urllib.parse.quote_plus(secret, safe="")}
    forms |= {json.dumps(f, ensure_ascii=ascii)[1:-1] for f in list(forms) for ascii in (True, False)}
    return {f for f in forms if f and f != MASK}


def _env_names(cfg: Config) -> list[str]:
    """The environment variables the config's `*_env` keys name: every target's token_env, notify's urls_env."""
    targets = [cfg.target, *(b.target for b in cfg.boxes)]
    return list(dict.fromkeys([*(t.token_env for t in targets), cfg.notify.urls_env]))
