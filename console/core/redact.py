"""Secrets out of every text the console keeps or shows for later: the audit log, alerts,
saved logs. A command line or a log line may carry a token; what is stored carries `***`.

Redacted: env assignments of *_TOKEN, *_KEY, *_SECRET, *PASSWORD, *PASSWD (HF_TOKEN=…,
WANDB_API_KEY=…, AWS_SECRET_ACCESS_KEY=…), flags ending in password/token/secret/key
(`--token x`, `--api-key=x`), URL credentials (`https://user:***@host`), Authorization headers
and bearer tokens, and tokens recognisable by their prefix (hf_…, ghp_…). A value that is only
a variable reference (`$HF_TOKEN`) is no secret and stays readable.
"""

from __future__ import annotations

import re

MASK = "***"

# A value as a shell command or a config line writes it: quoted, or up to a separator.
# Each pattern starts only where a name or scheme starts (not inside one), so that no input
# makes them try every position of a long run of word characters: linear time. None crosses
# a line break: a secret is on the line of its name.
_VALUE = r"""(?:"[^"\n]*"|'[^'\n]*'|\$\{\w+\}|[^\s'"`;&|<>(){}\[\],]+)"""
_SECRET_NAME = r"(?:(?:[A-Za-z0-9_]*_)?(?:TOKEN|KEY|SECRET)|[A-Za-z0-9_]*(?:PASSWORD|PASSWD))"

_PATTERNS = (
    # HF_TOKEN=x, aws_secret_access_key = x, "password": "x", --token=x, --api-key=x
    # (a word after a space is not the value when it is another flag: `--password : --max-tokens 8`)
    re.compile(rf"(?i)(?<![A-Za-z0-9_/])({_SECRET_NAME}[\"']?[ \t]*[=:][ \t]*)(?:(?<=[ \t])(?!--)|(?<![ \t]))"
               rf"({_VALUE})"),
    # --password x, --hf-token x, --api-key x (the value is the next word; another flag is not one)
    re.compile(rf"(?i)(?<![A-Za-z0-9_-])(--?[A-Za-z0-9_-]*(?:password|passwd|token|secret|key)[ \t]+)(?!-)({_VALUE})"),
    # Authorization: Bearer x / Basic x / x
    re.compile(rf"(?i)\b(authorization[\"']?[ \t]*[:=][ \t]*(?:(?:bearer|basic|token)[ \t]+)?)({_VALUE})"),
    # a bearer token on its own
    re.compile(r"(?i)\b(bearer[ \t]+)([A-Za-z0-9._~+/=-]{8,})"),
    # scheme://user:password@host
    re.compile(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://[^\s/?#@:]*:)([^\s/?#]*)(?=@)"),
    # tokens known by their prefix, wherever they stand
    re.compile(r"\b((?:hf|ghp|gho|ghs|ghu|github_pat)_)([A-Za-z0-9_]{16,})"),
)
_VARIABLE = re.compile(r"""^(["']?)\$\{?[A-Za-z_][A-Za-z0-9_]*\}?\1$""")


def _mask(match: re.Match) -> str:
    value = match.group(2)
    if value == MASK or _VARIABLE.match(value):
        return match.group(0)
    return match.group(1) + MASK


def redact(text: str) -> str:
    """text with every secret it carries replaced by ***."""
    for pattern in _PATTERNS:
        text = pattern.sub(_mask, text)
    return text


def redact_all(value):
    """Every string in a JSON-like value (dict, list, tuple, str) redacted; the rest as it is."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_all(v) for v in value]
    return value
