"""samai.toml → typed, validated dataclasses.

Every problem is reported as FILE: KEY: what was expected, got what; nothing is guessed.
With no file, the built-in `tiny` pipeline on this machine is the configuration.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from samai.console import paths
from samai.remote.model import Marker

# Keys the console binds itself; a stage may not take them.
RESERVED_KEYS = frozenset("q ? / k s r o c x l f n N w g G a S".split())
SEVERITIES = ("info", "warning", "error")
CHAIN_DONE = Marker("CHAIN_DONE", r"CHAIN_DONE rc=\d+", "info")
BUILTIN_PIPELINES = ("tiny", "samai-8b")


class ConfigError(Exception):
    def __init__(self, source: str, key: str, expected: str, got: Any = None) -> None:
        got_text = "" if got is None else f", got {got!r}"
        super().__init__(f"{source}: {key}: expected {expected}{got_text}")
        self.source, self.key = source, key


@dataclass(frozen=True)
class Target:
    url: str = "local"
    python: str = ""  # the box's Python for the box tools (>= 3.8); empty: see box_python
    poll_interval: float = 1.0
    timeout: float = 30.0  # deadline of one call to the box
    keepalive_interval: float = 5.0  # SSH: a silent link is noticed after interval * count
    keepalive_count: int = 3
    connect_timeout: float = 10.0
    max_channels: int = 6  # SSH: concurrent channels on the one connection
    token_env: str = "SAMAI_ENVELOPE_TOKEN"  # envelope: the variable holding the gateway's token

    @property
    def is_local(self) -> bool:
        return self.url == "local"

    @property
    def box_python(self) -> str:
        """The console's own interpreter on this machine (no PATH shims to start), else python3."""
        return self.python or (sys.executable if self.is_local else "python3")


@dataclass(frozen=True)
class Budget:
    capacity_gb: float | None = None  # the container's real size when statvfs overstates it
    reserve_gb: float = 2.0  # kept free on top of every projection


@dataclass(frozen=True)
class Artifact:
    name: str
    path: str  # relative paths are inside the workspace
    size_gb: float = 0.0  # the expected size, for projections before it exists
    intermediate: bool = False  # may be deleted once what it feeds exists


@dataclass(frozen=True)
class Stage:
    name: str
    key: str
    command: str
    log: str
    description: str = ""
    markers: tuple[Marker, ...] = ()
    needs: tuple[str, ...] = ()
    makes: tuple[str, ...] = ()
    frees: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    poison: tuple[str, ...] = ()  # files a previous run leaves that must go before a restart
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Ui:
    theme: str = "samai-dark"
    max_log_lines: int = 20_000
    tail_lines: int = 200
    keys: tuple[tuple[str, str], ...] = ()  # binding id -> key, applied with App.set_keymap
    eval_reports: str = "runs/eval/*/summary.json"  # eval summaries, a glob in the workspace


@dataclass(frozen=True)
class Config:
    source: str
    pipeline: str
    target: Target
    workspace: str
    budget: Budget
    artifacts: tuple[Artifact, ...]
    stages: tuple[Stage, ...]
    model: tuple[tuple[str, Any], ...] = ()
    ui: Ui = field(default_factory=Ui)

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def artifact(self, name: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.name == name), None)

    def with_target(self, url: str) -> Config:
        workspace = self.workspace
        if self.target.is_local and url != "local" and workspace == str(paths.default_workspace(self.pipeline)):
            workspace = f"samai/{self.pipeline}"  # the default workspace of a remote box: in its home
        return replace(self, target=replace(self.target, url=url), workspace=workspace)


# ------------------------------------------------------------------ reading


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """The config at path, or the built-in tiny pipeline when path is None."""
    if path is None:
        return load_builtin("tiny")
    source = str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(source, "(file)", "a readable file", e.strerror) from e
    except UnicodeDecodeError as e:
        raise ConfigError(source, "(file)", "UTF-8 text", f"invalid byte at {e.start}") from e
    return parse(text, source)


def load_builtin(name: str) -> Config:
    if name not in BUILTIN_PIPELINES:
        raise ConfigError("(built-in)", "pipeline", f"one of {', '.join(BUILTIN_PIPELINES)}", name)
    text = resources.files("samai.console").joinpath("pipelines", f"{name}.toml").read_text("utf-8")
    return parse(text, f"(built-in {name})")


def parse(text: str, source: str) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "(syntax)", "valid TOML", str(e)) from e
    return _Reader(source).config(raw)


# ------------------------------------------------------------------ validation


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, expected: str, got: Any = None) -> ConfigError:
        return ConfigError(self.source, key, expected, got)

    def table(self, raw: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self.fail(key, "a table", raw)
        for name in raw:
            if name not in allowed:
                where = f"{key}.{name}" if key else name
                raise self.fail(where, f"one of the keys {', '.join(sorted(allowed))}", name)
        return raw

    def mapping(self, raw: Any, key: str) -> dict[str, Any]:
        """A table whose keys are the user's own names (stages, artifacts, model settings)."""
        return self.table(raw, key, set(raw) if isinstance(raw, dict) else set())

    def value(self, raw: dict[str, Any], key: str, where: str, kind: str, check: Callable[[Any], bool],
              default: Any) -> Any:
        if key not in raw:
            return default
        v = raw[key]
        if not check(v):
            raise self.fail(f"{where}.{key}" if where else key, kind, v)
        return v

    def text(self, raw, key, where, default=""):
        return self.value(raw, key, where, "a string", lambda v: isinstance(v, str), default)

    def number(self, raw, key, where, default, minimum=0.0):
        ok = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= minimum  # noqa: E731
        return self.value(raw, key, where, f"a number >= {minimum:g}", ok, default)

    def integer(self, raw, key, where, default, minimum=1):
        ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum  # noqa: E731
        return self.value(raw, key, where, f"an integer >= {minimum}", ok, default)

    def names(self, raw, key, where):
        ok = lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)  # noqa: E731
        return tuple(self.value(raw, key, where, "a list of strings", ok, []))

    # -------------------------------------------------------------- tables

    def config(self, raw: dict[str, Any]) -> Config:
        self.table(raw, "", {"pipeline", "target", "workspace", "budget", "artifacts", "stages", "model", "ui"})
        pipeline = self.text(raw, "pipeline", "", "custom")
        target = self.target(raw.get("target"))
        artifacts = self.artifacts(raw.get("artifacts"))
        stages = self.stages(raw.get("stages"), {a.name for a in artifacts})
        model = self.mapping(raw.get("model"), "model")
        return Config(
            source=self.source,
            pipeline=pipeline,
            target=target,
            workspace=self.workspace(raw.get("workspace"), pipeline, target),
            budget=self.budget(raw.get("budget")),
            artifacts=artifacts,
            stages=stages,
            model=tuple(model.items()),
            ui=self.ui(raw.get("ui")),
        )

    def target(self, raw: Any) -> Target:
        t = self.table(raw, "target", {"url", "python", "poll_interval", "timeout", "keepalive_interval",
                                       "keepalive_count", "connect_timeout", "max_channels", "token_env"})
        url = self.text(t, "url", "target", "local")
        if not re.match(r"^(local|ssh://.+|envelope\+https?://.+)$", url):
            raise self.fail("target.url", "local, ssh://user@host[:port] or envelope+http(s)://host[:port]", url)
        return Target(url, self.text(t, "python", "target", ""),
                      float(self.number(t, "poll_interval", "target", 1.0, 0.1)),
                      float(self.number(t, "timeout", "target", 30.0, 1.0)),
                      float(self.number(t, "keepalive_interval", "target", 5.0, 0.0)),
                      self.integer(t, "keepalive_count", "target", 3, 1),
                      float(self.number(t, "connect_timeout", "target", 10.0, 0.5)),
                      self.integer(t, "max_channels", "target", 6, 1),
                      self.text(t, "token_env", "target", "SAMAI_ENVELOPE_TOKEN"))

    def workspace(self, raw: Any, pipeline: str, target: Target) -> str:
        w = self.table(raw, "workspace", {"path"})
        path = self.text(w, "path", "workspace", "")
        if not path:
            return str(paths.default_workspace(pipeline)) if target.is_local else f"samai/{pipeline}"
        if target.is_local:
            return os.path.expanduser(path)
        return path[2:] if path.startswith("~/") else path  # a remote command starts in the home folder

    def budget(self, raw: Any) -> Budget:
        b = self.table(raw, "budget", {"capacity_gb", "reserve_gb"})
        capacity = self.number(b, "capacity_gb", "budget", None, 0.000001)
        return Budget(capacity, float(self.number(b, "reserve_gb", "budget", 2.0)))

    def artifacts(self, raw: Any) -> tuple[Artifact, ...]:
        table = self.mapping(raw, "artifacts")
        out = []
        for name, spec in table.items():
            where = f"artifacts.{name}"
            a = self.table(spec, where, {"path", "size_gb", "intermediate"})
            if "path" not in a:
                raise self.fail(f"{where}.path", "the artifact's path (relative to the workspace)")
            out.append(Artifact(name, self.text(a, "path", where), float(self.number(a, "size_gb", where, 0.0)),
                                self.value(a, "intermediate", where, "true or false",
                                           lambda v: isinstance(v, bool), False)))
        return tuple(out)

    def stages(self, raw: Any, artifact_names: set[str]) -> tuple[Stage, ...]:
        table = self.mapping(raw, "stages")
        stages: list[Stage] = []
        for name, spec in table.items():
            stage = self.stage(name, spec, artifact_names)
            clash = next((s for s in stages if s.key == stage.key), None)
            if clash:
                raise self.fail(f"stages.{name}.key", f"a key no other stage uses ({clash.name} has it)", stage.key)
            stages.append(stage)
        return tuple(stages)

    def stage(self, name: str, raw: Any, artifact_names: set[str]) -> Stage:
        where = f"stages.{name}"
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", name):
            raise self.fail(where, "a stage name of letters, digits, '_', '.', '-'", name)
        s = self.table(raw, where, {"key", "command", "log", "description", "markers", "needs", "makes",
                                    "frees", "ports", "poison", "env"})
        key = self.value(s, "key", where, "one key, not one the console uses itself ("
                         + " ".join(sorted(RESERVED_KEYS)) + ")",
                         lambda v: isinstance(v, str) and len(v) == 1 and v not in RESERVED_KEYS, None)
        if key is None:
            raise self.fail(f"{where}.key", "the key that fires this stage")
        command = self.text(s, "command", where)
        if not command.strip():
            raise self.fail(f"{where}.command", "the shell command the stage runs")
        refs = {}
        for field_name in ("needs", "makes", "frees"):
            refs[field_name] = self.names(s, field_name, where)
            unknown = [n for n in refs[field_name] if n not in artifact_names]
            if unknown:
                raise self.fail(f"{where}.{field_name}", "names of declared [artifacts]", unknown[0])
        ports = self.value(s, "ports", where, "a list of TCP ports (1-65535)",
                           lambda v: isinstance(v, list) and all(isinstance(p, int) and 0 < p < 65536 for p in v),
                           [])
        env = self.value(s, "env", where, "a table of string values",
                         lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), {})
        return Stage(name=name, key=key, command=command, log=self.text(s, "log", where, f"logs/{name}.log"),
                     description=self.text(s, "description", where),
                     markers=self.markers(s.get("markers"), f"{where}.markers"),
                     needs=refs["needs"], makes=refs["makes"], frees=refs["frees"],
                     ports=tuple(ports), poison=self.names(s, "poison", where), env=tuple(env.items()))

    def markers(self, raw: Any, where: str) -> tuple[Marker, ...]:
        if raw is None:
            return (CHAIN_DONE,)
        if not isinstance(raw, list):
            raise self.fail(where, "a list of { name, pattern, severity } tables", raw)
        out = [CHAIN_DONE]
        for i, spec in enumerate(raw):
            at = f"{where}[{i}]"
            m = self.table(spec, at, {"name", "pattern", "severity"})
            name = self.text(m, "name", at)
            if not name:
                raise self.fail(f"{at}.name", "the marker's name")
            pattern = self.text(m, "pattern", at, re.escape(name))
            try:
                re.compile(pattern.encode())
            except re.error as e:
                raise self.fail(f"{at}.pattern", "a valid regular expression", f"{pattern} ({e})") from e
            severity = self.value(m, "severity", at, " or ".join(SEVERITIES), lambda v: v in SEVERITIES, "info")
            out.append(Marker(name, pattern, severity))
        return tuple(m for i, m in enumerate(out) if m.name not in {o.name for o in out[:i]})

    def ui(self, raw: Any) -> Ui:
        u = self.table(raw, "ui", {"theme", "max_log_lines", "tail_lines", "keys", "eval_reports"})
        keys = self.value(u, "keys", "ui", "a table of binding id = \"key\"",
                          lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), {})
        return Ui(self.text(u, "theme", "ui", "samai-dark"),
                  self.integer(u, "max_log_lines", "ui", 20_000, 100),
                  self.integer(u, "tail_lines", "ui", 200, 0),
                  tuple(keys.items()),
                  self.text(u, "eval_reports", "ui", "runs/eval/*/summary.json"))
