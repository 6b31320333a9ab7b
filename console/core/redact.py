"""Secrets out of every text the console keeps or shows: the audit log, alerts, saved logs, the
confirmations, the process pane. A command line or a log line may carry a token; what is stored
or shown carries `***`.

Redacted, wherever they stand (a command line, a log line, a JSON record):
- by name: env assignments of *_TOKEN, *_KEY, *_SECRET, *_AUTH, *_PASS, *_PWD, *PASSWORD,
  *PASSWD, *PASSPHRASE and SSHPASS (HF_TOKEN=…, WANDB_API_KEY=…, MYSQL_PWD=…), and flags ending in
  password/passwd/passphrase/pass/auth/token/secret/key (`--token x`, `--api-key=x`, `-pass x`);
- in URLs: `user:***@host`, and the credentials of a query string (pre-signed URLs:
  X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token, X-Goog-Signature, Azure's `sig=`;
  `token=`, `access_token=`, `api_key=`, `key=`, `password=`…);
- by the tool: flags that are a password only for that tool (`sshpass -p`, `mysql -pX`,
  `docker login -p`, `redis-cli -a`, `ldapsearch -w`, `sqlcmd -P`, `curl -u user:***`,
  `smbclient -U user%***`, `openssl -pass pass:***`, `wandb login KEY`): elsewhere `-p` is a port;
  also among one-letter options written as one word (`curl -sfu user:***`, `ldapsearch -xw***`);
- by their shape: Authorization and Cookie headers, bearer tokens, tokens known by their prefix
  (hf_, ghp_, sk-, sk-ant-, xoxb-, glpat-, AKIA…, AIza…), JSON web tokens, private key blocks.

A value that is only a variable reference (`$HF_TOKEN`) is no secret and stays readable.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

MASK = "***"

# A value as a shell command or a config line writes it: quoted, or up to a separator. Each
# pattern starts only where a name, a flag, a scheme or a prefix starts (not inside one), so that
# no input makes them try every position of a long run of word characters: linear time. None
# crosses a line break (a secret is on the line of its name), but for a private key block, whose
# base64 lines run up to its END line.
_VALUE = r"""(?:"[^"\n]*"|'[^'\n]*'|\$\{\w+\}|[^\s'"`;&|<>(){}\[\],]+)"""
_SECRET_NAME = (r"(?:(?:[A-Za-z0-9_]*_)?(?:TOKEN|KEY|SECRET)|[A-Za-z0-9_]*_(?:AUTH|PASS|PWD)"
                r"|[A-Za-z0-9_]*(?:PASSWORD|PASSWD|PASSPHRASE)|SSHPASS)")
_SECRET_FLAG = (r"--?(?:[A-Za-z0-9_-]*[-_])?(?:pass|auth|pass(?:in|out))"
                r"|--?[A-Za-z0-9_-]*(?:password|passwd|passphrase|token|secret|key)")
# A query string's parameter that is a credential (name=value up to the next & or #).
_QUERY_SECRET = r"(?:[A-Za-z0-9_.-]*[_.-])?(?:signature|sig|credential|token|key|apikey|secret|password|passwd|pwd)"
_QUERY_VALUE = r"(?:[^\s&#%'\"`<>(){}\[\],\\]|%(?!26))+"  # up to the next & (or %26: an encoded one)
_PEM_BEGIN = r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----"
_PEM_BODY = r"(?:[^-]|-(?!----))"  # anything up to the next run of five dashes (its END line)
_PREFIXES = (r"(?:hf|ghp|gho|ghs|ghu|ghr|github_pat|npm|gsk|r8|(?:sk|rk)_(?:live|test))_"
             r"|glpat-|gldt-|glrt-|xox[abposr]-|xapp-")

_SECRET_NAME_ONLY = re.compile(_SECRET_NAME, re.IGNORECASE)
_NAME_WORDS = "token key secret auth pass pwd"


def _rule(needles: str, pattern: str, named: bool = False) -> tuple[tuple[str, ...], str, bool]:
    """A pattern, and the words (lower case) one of which a text holds if it can match: most
    texts hold none, and a search for a word is much cheaper than the pattern's. named: the
    value is a secret by its name only, and a switch there is none (`add_bos_token=true`)."""
    return tuple(needles.split()), pattern, named


@functools.cache
def _compiled(pattern: str) -> re.Pattern:
    """A rule's pattern compiled when a text first holds one of its words, not at import: the
    console's start redacts a target like `local`, which holds none."""
    return re.compile(pattern)


_RULES = (
    # HF_TOKEN=x, aws_secret_access_key = x, "password": "x", --token=x, --api-key=x
    # (a word after a space is not the value when it is another flag: `--password : --max-tokens 8`)
    _rule(_NAME_WORDS, rf"(?i)(?<![A-Za-z0-9_/])({_SECRET_NAME}[\"']?[ \t]*[=:][ \t]*)"
                       rf"(?:(?<=[ \t])(?!--)|(?<![ \t]))({_VALUE})", named=True),
    # --password x, --hf-token x, --auth=x, -pass x (the next word; another flag is not one)
    _rule(_NAME_WORDS, rf"(?i)(?<![A-Za-z0-9_-])((?:{_SECRET_FLAG})(?:[ \t]+(?!-)|=))({_VALUE})", named=True),
    # Authorization: Bearer x / Basic x / AWS4-HMAC-SHA256 Credential=…, Signature=… (the whole
    # header: up to a quote or the line's end)
    _rule("authorization", r"(?i)\b(authorization[\"']?[ \t]*[:=][ \t]*(?:(?:bearer|basic|token)[ \t]+)?)"
                           r"(\"[^\"\n]*\"|'[^'\n]*'|[^\n\"']+)"),
    # Cookie: a=x; b=y (every cookie: up to a quote or the line's end)
    _rule("cookie", r"(?i)(?<![A-Za-z0-9_-])((?:set-)?cookie[\"']?[ \t]*:[ \t]*)([^\n\"']+)"),
    # a bearer token on its own
    _rule("bearer", r"(?i)\b(bearer[ \t]+)([A-Za-z0-9._~+/=-]{8,})"),
    # scheme://user:password@host
    _rule("://", r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://[^\s/?#@:]*:)([^\s/?#]*)(?=@)"),
    # ?X-Amz-Signature=x, &sig=x, &access_token=x (also percent-encoded, in another URL's query)
    _rule("sig credential token key secret pass pwd",
          rf"(?i)((?:[?&]|%3F|%26){_QUERY_SECRET}(?:=|%3D))({_QUERY_VALUE})"),
    # .netrc: machine host login user password x
    _rule("login", rf"(?i)(?<![A-Za-z0-9_-])(login[ \t]+[^\s]+[ \t]+password[ \t]+)({_VALUE})"),
    # tokens known by their prefix, wherever they stand
    _rule("hf_ gh github_pat_ npm_ gsk_ r8_ k_live_ k_test_ glpat- gldt- glrt- xox xapp-",
          rf"(?<![A-Za-z0-9_-])({_PREFIXES})([A-Za-z0-9_-]{{20,}})"),
    # sk-…, sk-proj-…, sk-ant-…: a digit or a capital in it (`sk-some-long-package-name` is a word)
    _rule("sk-", r"(?<![A-Za-z0-9_-])(sk-)((?=[a-z_-]*[A-Z0-9])[A-Za-z0-9_-]{20,})"),
    _rule("akia asia", r"\b(AKIA|ASIA)([0-9A-Z]{16})\b"),  # AWS access key ids
    _rule("aiza", r"(?<![A-Za-z0-9_-])(AIza)([0-9A-Za-z_-]{35})"),  # Google API keys
    # a JSON web token: header.payload.signature, its header `{"…` in base64
    _rule("eyj", r"(?<![A-Za-z0-9_-])(eyJ)([A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*)"),
    # a private key block up to its END line (its lines of base64), else the rest of its line
    _rule("-----begin", rf"({_PEM_BEGIN})({_PEM_BODY}*+)(?=-----END )"),
    _rule("-----begin", rf"({_PEM_BEGIN})((?:[^\n-]|-(?!----))++)"),
)
_VARIABLE = re.compile(r"""^(["']?)\$\{?[A-Za-z_][A-Za-z0-9_]*\}?\1$""")
# After a secret's name, a switch is no secret: `add_bos_token=true` (a GGUF key), `--use-auth-token false`.
_SWITCHES = frozenset(("true", "false", "yes", "no", "on", "off", "none", "null"))


def _mask(match: re.Match) -> str:
    value = match.group(2)
    if _no_secret(value):
        return match.group(0)
    return match.group(1) + MASK


def _mask_named(match: re.Match) -> str:
    return match.group(0) if _switch(match.group(2)) else _mask(match)


def _no_secret(value: str) -> bool:
    return value == MASK or bool(_VARIABLE.match(value))


def _switch(value: str) -> bool:
    return value.strip("\"'").lower() in _SWITCHES


# ------------------------------------------------------------------ flags that are a password for one tool


@dataclass(frozen=True)
class _Tool:
    """The flags that hold a password on this tool's command line, each with where the password
    is in its value: "all" of it, after a separator (curl's `user:password`), or "attached" (only
    `-pX`: mysql's `-p X` asks at the terminal and X is the database)."""

    flags: dict[str, str] = field(default_factory=dict)
    options_first: bool = False  # its options end at the first operand (sshpass: then the command)
    operand: bool = False  # the first operand is the secret (`wandb login KEY`)
    # Its one-letter options combine in one word (`-sfu user:pass`, `-xwPASS`, as getopt reads
    # them); `values`: the letters of those that take a value, where such a word's letters end
    # (`curl -XPUT`: PUT is the method, not -P, -U and -T).
    clusters: bool = True
    values: str = ""


_MYSQL = _Tool({"-p": "attached"}, values="hPuDeSAO")
_MONGO = _Tool({"-p": "all"}, values="uh")
_LDAP = _Tool({"-w": "all"}, values="bDHhpsfcleoPOYRUXyEITaz")
_TOOLS = {
    "sshpass": _Tool({"-p": "all"}, options_first=True, values="fdP"),
    "login": _Tool({"-p": "all"}, values="u"),  # docker, podman, oc, az, helm registry … login
    "wandb login": _Tool(operand=True),
    "curl": _Tool({"-u": ":", "--user": ":", "-U": ":", "--proxy-user": ":", "-b": "all", "--cookie": "all"},
                  values="AcCdDeEFHKmoPQrtTwxXyYz"),
    "http": _Tool({"-a": ":", "--auth": ":"}, values="Aop"),  # httpie
    "https": _Tool({"-a": ":", "--auth": ":"}, values="Aop"),
    "redis-cli": _Tool({"-a": "all"}, values="hpsnu"),
    "smbclient": _Tool({"-U": "%", "--user": "%"}, values="RsOMiIpnWdDTLcmtlbA"),
    "sqlcmd": _Tool({"-P": "all"}, values="SUdQqiohHltw"),
    "bcp": _Tool({"-P": "all"}, values="SUdQqiohHltwfeFLbamr"),
    # single-dash long options (-pass, -keyform): no letters to combine
    "openssl": _Tool({"-pass": "pass:", "-passin": "pass:", "-passout": "pass:", "-k": "all"}, clusters=False),
    **dict.fromkeys(("mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlshow", "mysqlcheck", "mysqlpump",
                     "mysqlbinlog", "mysqlslap", "mariadb", "mariadb-dump", "mariadb-admin"), _MYSQL),
    **dict.fromkeys(("mongo", "mongosh", "mongodump", "mongorestore", "mongoexport", "mongoimport"), _MONGO),
    **dict.fromkeys(("ldapsearch", "ldapadd", "ldapmodify", "ldapdelete", "ldappasswd", "ldapwhoami"), _LDAP),
}
_TOOL_NAMES = frozenset(name.split()[-1] for name in _TOOLS)
_SECOND_WORDS = frozenset(name.split()[-1] for name in _TOOLS if " " in name)  # `wandb login`
# A shell word (its quoted parts may hold blanks and separators), a separator, or a quote left open.
_WORD = re.compile(r"""(?:"[^"\n]*"|'[^'\n]*'|[^\s;&|"'])+|[;&|\n]|["']""")
_QUOTED = re.compile(r""""([^"\n]*)"|'([^'\n]*)'""")


def _tool_password_spans(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """Where the passwords of tools' flags are in text[start:end], word by word (one pass: each
    word is read once, and a quoted word's inside once more, as a command of its own)."""
    tool: _Tool | None = None
    pending = ""  # where the password is in the next word (its flag was the word before)
    previous = ""
    for m in _WORD.finditer(text, start, end):
        word = m.group()
        if word in (";", "&", "|", "\n"):
            tool, pending = None, ""
        elif pending:
            yield from _value_span(text, m.start(), m.end(), pending)
            pending = ""
        else:
            if " " in word or "\t" in word:  # a quoted command: `sh -c "curl -u a:b …"`
                for q in _QUOTED.finditer(word):
                    yield from _tool_password_spans(text, m.start() + q.start() + 1, m.start() + q.end() - 1)
            spans: list[tuple[int, int]] = []
            if tool is not None:
                tool, pending, spans = _tool_word(tool, word, m.start())
                yield from spans
            name = word.strip("\"'")
            name = name[name.rfind("/") + 1:] if "://" not in name else ""  # a URL's …/login is no tool
            found = _TOOLS.get(f"{previous} {name}" if name in _SECOND_WORDS else name) or _TOOLS.get(name)
            previous = name
            if found is not None and not spans and not pending:  # a password may be named like a tool
                tool = found


def _tool_word(tool: _Tool, word: str, at: int) -> tuple[_Tool | None, str, list[tuple[int, int]]]:
    """A word on the tool's command line: (the tool, if its options go on; where the password is
    in the next word, if this is its flag; the password spans in this word)."""
    if not word.startswith("-"):
        if tool.operand:
            return None, "", list(_value_span(word, 0, len(word), "all", at))
        return (None if tool.options_first else tool), "", []
    for flag, where in tool.flags.items():
        if word == flag:
            return tool, ("" if where == "attached" else where), []
        value_at = _attached_value(flag, word)
        if value_at:
            return tool, "", list(_value_span(word, value_at, len(word), "all" if where == "attached" else where, at))
    if tool.clusters and not word.startswith("--"):
        return _cluster(tool, word, at)
    return tool, "", []


def _cluster(tool: _Tool, word: str, at: int) -> tuple[_Tool, str, list[tuple[int, int]]]:
    """A word of one-letter options (`-sfu`, `-sfuUSER:PASS`, `-vpPASS`): a password flag among
    them takes the rest of the word, or the next word when it is the last letter."""
    for i in range(1, len(word)):
        letter = word[i]
        where = tool.flags.get("-" + letter)
        if where is not None:
            if i + 1 < len(word):
                return tool, "", list(_value_span(word, i + 1, len(word), "all" if where == "attached" else where, at))
            return tool, ("" if where == "attached" else where), []
        if letter in tool.values or not letter.isalnum():
            break  # the rest is that option's value, or this is no word of options (-1.5, -=)
    return tool, "", []


def _attached_value(flag: str, word: str) -> int:
    """Where the value of flag starts in word when it is attached (`--user=a:b`, `-pX`); 0: it is not."""
    if flag.startswith("--"):
        return len(flag) + 1 if word.startswith(flag + "=") else 0
    return len(flag) if word.startswith(flag) and len(word) > len(flag) else 0


def _value_span(text: str, start: int, end: int, where: str, at: int = 0) -> Iterator[tuple[int, int]]:
    """The password in the value text[start:end] (offset by `at`): all of it, or after `where`
    (a separator), inside the value's quotes. Nothing for a variable reference or a mask."""
    value = text[start:end]
    if where != "all":
        inner_end = end - 1 if len(value) > 1 and value[0] in "\"'" and value[-1] == value[0] else end
        cut = text.find(where, start, inner_end)
        if cut < 0:
            return
        start, end = cut + len(where), inner_end
        value = text[start:end]
    if value and not _no_secret(value):
        yield at + start, at + end


def _mask_tool_passwords(text: str) -> str:
    out, last = [], 0
    for start, end in sorted(_tool_password_spans(text, 0, len(text))):
        if start < last:  # within the one masked just before (a quoted password that reads as a command)
            last = max(last, end)
            continue
        out += [text[last:start], MASK]
        last = end
    return "".join(out) + text[last:]


def redact(text: str) -> str:
    """text with every secret it carries replaced by ***."""
    if any(name in text for name in _TOOL_NAMES):
        text = _mask_tool_passwords(text)  # first: a password may look like anything the patterns know
    lowered = text.lower()
    for needles, pattern, named in _RULES:
        if any(n in lowered for n in needles):
            text = _compiled(pattern).sub(_mask_named if named else _mask, text)
    return text


def secret_name(name: str) -> bool:
    """Whether a variable's name is a secret's (HF_TOKEN, MYSQL_PWD, SSHPASS): its value is one, whatever its shape."""
    return bool(_SECRET_NAME_ONLY.fullmatch(name))


def redact_assignment(name: str, value: str) -> str:
    """`NAME=value` as shown: the whole value of a secret name (HF_TOKEN) masked, however it is
    written (blanks, quotes, line breaks: a text pattern could stop short); any other redacted."""
    if secret_name(name) and not _no_secret(value) and not _switch(value):
        return f"{name}={MASK}"
    return redact(f"{name}={value}")


def redact_all(value):
    """Every string in a JSON-like value (dict, list, tuple, str) redacted; the rest as it is."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_all(v) for v in value]
    return value
