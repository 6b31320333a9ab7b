"""The config loader under hypothesis: arbitrary bytes, TOML-ish text and arbitrary values for
every known key. Only ConfigError may come out, and what loads keeps its promises (finite
sizes, every workspace path inside the workspace)."""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.config import ConfigError

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

KEYS = {
    "target": ["url", "python", "poll_interval", "timeout", "keepalive_interval", "keepalive_count",
               "connect_timeout", "max_channels", "token_env"],
    "workspace": ["path"],
    "budget": ["capacity_gb", "reserve_gb"],
    "ui": ["theme", "max_log_lines", "tail_lines", "keys", "eval_reports"],
}
ARTIFACT_KEYS = ["path", "size_gb", "intermediate"]
STAGE_KEYS = ["key", "command", "log", "description", "role", "markers", "needs", "makes", "frees", "ports", "poison",
              "env"]

paths = st.sampled_from(["a", "logs/x.log", "../x", "/tmp/x.log", "/", "~", "~/x", "..", ".", "", "a/../../b",
                         "/etc/passwd", "a\x00b", "models/base", "runs/eval/*/summary.json", "/home", "/usr/x"])
numbers = st.one_of(st.integers(), st.integers(min_value=-(10 ** 400), max_value=10 ** 400),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, -0.0, 5e-324]))
scalars = st.one_of(st.booleans(), numbers, st.text(max_size=20), paths, st.sampled_from([*config.ROLES, "Train"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8)
names = st.one_of(st.sampled_from(["base", "merged", "train", "x.y", "../up", "a b", "[x]"]), st.text(max_size=8))


def _table(keys: list[str]):
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=6)), values, max_size=len(keys))


documents = st.fixed_dictionaries({}, optional={
    "pipeline": st.one_of(st.sampled_from(["tiny", "../../etc", "a/b", ""]), values),
    **{name: st.one_of(_table(keys), values) for name, keys in KEYS.items()},
    "artifacts": st.one_of(st.dictionaries(names, st.one_of(_table(ARTIFACT_KEYS), values), max_size=3), values),
    "stages": st.one_of(st.dictionaries(names, st.one_of(_table(STAGE_KEYS), values), max_size=3), values),
    "model": values,
})


def toml_value(v) -> str:
    """A TOML literal of v (TOML has inf and nan; a lone surrogate makes the document invalid, as it should)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_document(doc: dict) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in doc.items())


def holds_its_promises(cfg: config.Config) -> None:
    assert all(math.isfinite(a.size_gb) and 0 <= a.size_gb <= config.MAX_GB for a in cfg.artifacts)
    assert cfg.budget.capacity_gb is None or math.isfinite(cfg.budget.capacity_gb)
    inside = [a.path for a in cfg.artifacts] + [s.log for s in cfg.stages] + [p for s in cfg.stages for p in s.poison]
    assert all(config.escape_reason(p, cfg.workspace) is None for p in inside + [cfg.ui.eval_reports])
    assert all(s.role in config.ROLES for s in cfg.stages)
    if cfg.target.is_local:
        assert config.local_workspace_reason(cfg.workspace) is None
    else:
        assert config.remote_workspace_reason(cfg.workspace) is None


@pytest.mark.slow
@FUZZ
@given(documents)
def test_any_values_for_the_known_keys_give_a_config_or_a_config_error(doc):
    try:
        cfg = config.parse(toml_document(doc), "fuzz.toml")
    except ConfigError as e:
        assert str(e).startswith("fuzz.toml: ") and "\n" not in str(e)
        return
    holds_its_promises(cfg)


fragments = st.sampled_from(["[target]", "[workspace]", "[budget]", "[ui]", "[stages.s]", "[artifacts.a]",
                             "[[stages]]", "url = ", "path = ", "size_gb = ", "log = ", "key = ", "command = ",
                             "poison = ", "markers = ", "\"", "'", "'''", "[", "]", "{", "}", ",", "=", "\n", " ",
                             "inf", "nan", "1e308", "-1", "0x7f", "\\u0000", "\\", "#", "\"../x\"", "\"/tmp/x\"",
                             "[" * 50, "{ a = " * 20, "\"~\"", "true", "1979-05-27"])
tomlish = st.lists(st.one_of(fragments, st.text(max_size=5)), max_size=40).map("".join)


@FUZZ
@given(tomlish)
def test_toml_ish_text_gives_a_config_or_a_config_error(text):
    try:
        holds_its_promises(config.parse(text, "fuzz.toml"))
    except ConfigError:
        pass


@FUZZ
@given(st.binary(max_size=2000))
def test_any_file_gives_a_config_or_a_config_error(tmp_path, data):
    f = tmp_path / "fuzz.toml"
    f.write_bytes(data)
    try:
        holds_its_promises(config.load(f))
    except ConfigError as e:
        assert str(e).startswith(f"{f}: ")


def test_deeply_nested_toml_is_a_config_error(tmp_path):
    for text in ("a = " + "[" * 100_000 + "]" * 100_000, "a = " + "{ b = " * 100_000 + "1" + " }" * 100_000):
        with pytest.raises(ConfigError, match="valid TOML"):
            config.parse(text, "deep.toml")


@pytest.mark.parametrize("value", ["1e308", "inf", "-inf", "nan", "-1", "1" + "0" * 400])
def test_an_absurd_size_names_the_file_and_the_key(tmp_path, value):
    f = tmp_path / "size.toml"
    f.write_text(f'[artifacts.a]\npath = "a"\nsize_gb = {value}\n')
    with pytest.raises(ConfigError) as err:
        config.load(f)
    assert str(err.value).startswith(f"{f}: artifacts.a.size_gb: expected a number >= 0 and <= ")
    assert len(str(err.value)) - len(str(f)) < 250  # the value is cut short, wherever the file is


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "/dev/null", "fifo", "folder", "huge"])
def test_a_config_that_is_no_small_regular_file_is_refused_before_it_is_read(tmp_path, special):
    if special == "fifo":
        path = tmp_path / "fifo.toml"
        os.mkfifo(path)  # no writer ever comes: an open or a read that waits would hang the test
    elif special == "folder":
        path = tmp_path
    elif special == "huge":
        path = tmp_path / "huge.toml"
        with open(path, "wb") as f:
            f.truncate(4 << 30)  # sparse: 4 GiB that a reader would try to hold
    else:
        path = Path(special)
    done: list = []
    reader = threading.Thread(target=lambda: done.append(_load_error(path)), daemon=True)
    reader.start()
    reader.join(30)
    assert done, f"loading {path} did not return"
    message = done[0]
    assert message.startswith(f"{path}: (file): expected ")
    assert "a regular file" in message or "at most 1048576 bytes" in message


def _load_error(path: Path) -> str:
    try:
        config.load(path)
    except ConfigError as e:
        return str(e)
    return "loaded"
