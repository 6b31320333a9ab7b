"""samai.toml loading: typed results, and one clear line for every kind of mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from samai.console.core import config
from samai.console.core.config import ConfigError
from tests.helpers import run_cli

GOOD = """
pipeline = "demo"
[target]
url = "local"
poll_interval = 0.5
[workspace]
path = "~/demo-ws"
[budget]
capacity_gb = 57
[artifacts.base]
path = "models/base"
size_gb = 19.3
[artifacts.merged]
path = "models/merged"
size_gb = 18.5
intermediate = true
[stages.merge]
key = "m"
command = "python3 merge.py"
needs = ["base"]
makes = ["merged"]
ports = [8080]
markers = [{ name = "MERGE_DONE" }, { name = "TRAIN_NAN", pattern = "TRAIN_NAN|nan guard", severity = "error" }]
[ui]
keys = { stop_stage = "x" }
"""


def test_a_good_file_becomes_typed_config(tmp_path: Path) -> None:
    f = tmp_path / "samai.toml"
    f.write_text(GOOD)
    cfg = config.load(f)
    assert cfg.pipeline == "demo" and cfg.target.poll_interval == 0.5
    assert cfg.workspace == str(Path.home() / "demo-ws")
    assert cfg.budget.capacity_gb == 57
    merged = cfg.artifact("merged")
    assert merged.size_gb == 18.5 and merged.intermediate
    stage = cfg.stage("merge")
    assert (stage.key, stage.needs, stage.makes, stage.ports, stage.log) == ("m", ("base",), ("merged",),
                                                                               (8080,), "logs/merge.log")
    assert [m.name for m in stage.markers] == ["CHAIN_DONE", "MERGE_DONE", "TRAIN_NAN"]
    assert stage.markers[2].severity == "error"
    assert cfg.ui.keys == (("stop_stage", "x"),)


def test_the_builtin_default_is_the_tiny_pipeline_on_this_machine() -> None:
    cfg = config.load(None)
    assert cfg.pipeline == "tiny" and cfg.target.is_local
    assert [s.name for s in cfg.stages] == ["provision", "fetch", "train", "merge", "convert", "quantize",
                                           "serve", "eval", "push", "restore"]
    assert cfg.workspace.endswith("samai/workspaces/tiny")
    model = dict(cfg.model)
    assert model["architecture"] == "LlamaForCausalLM" and model["hidden_size"] <= 256
    big = config.load_builtin("samai-8b")
    assert big.budget.capacity_gb == 57
    assert big.artifact("base").size_gb == 19.3 and big.artifact("gguf_q").size_gb == 5.5
    assert big.artifact("merged").intermediate and big.artifact("gguf_f16").intermediate


@pytest.mark.parametrize(
    "text, key, expected",
    [
        ("[target]\nurl = 5", "target.url", "a string"),
        ("[target]\nurl = 'ftp://x'", "target.url", "local, ssh://"),
        ("[target]\npoll_intervall = 1", "target.poll_intervall", "one of the keys"),
        ("colour = 'red'", "colour", "one of the keys"),
        ("[stages.x]\ncommand = 'a'", "stages.x.key", "the key that fires"),
        ("[stages.x]\nkey = 'q'\ncommand = 'a'", "stages.x.key", "one key, not one the console uses"),
        ("[stages.x]\nkey = 'z'\ncommand = 'a'\nneeds = ['nope']", "stages.x.needs", "declared [artifacts]"),
        ("[stages.x]\nkey = 'z'\ncommand = 'a'\nports = [70000]", "stages.x.ports", "TCP ports"),
        ("[stages.x]\nkey = 'z'\ncommand = 'a'\nrole = 'trainer'", "stages.x.role", "one of provision, fetch, train"),
        ("[stages.x]\nkey = 'z'\ncommand = 'a'\nmarkers = [{ name = 'A', pattern = '(' }]",
         "stages.x.markers[0].pattern", "a valid regular expression"),
        ("[stages.x]\nkey = 'z'\ncommand = 'a'\n[stages.y]\nkey = 'z'\ncommand = 'b'", "stages.y.key",
         "no other stage uses (x has it)"),
        ("[artifacts.a]\nsize_gb = 1", "artifacts.a.path", "the artifact's path"),
        ("[budget]\nreserve_gb = -1", "budget.reserve_gb", "a number >= 0"),
        ("stages = 3", "stages", "a table"),
        ("[ui]\nmax_log_lines = 'many'", "ui.max_log_lines", "an integer"),
        ("[target\nurl = 'local'", "(syntax)", "valid TOML"),
    ],
)
def test_mistakes_name_the_file_the_key_and_what_was_expected(tmp_path: Path, text, key, expected) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(f)
    message = str(err.value)
    assert message.startswith(f"{f}: {key}: expected ")
    assert expected in message


@pytest.mark.slow
def test_bad_config_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("[stages.train]\nkey = 'tt'\ncommand = 'x'\n")
    r = run_cli("--config", str(f), "snapshot")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "stages.train.key" in r.stderr and str(f) in r.stderr
    missing = run_cli("--config", str(tmp_path / "nope.toml"), "snapshot")
    assert missing.returncode == 2 and "a readable file" in missing.stderr
    assert "Traceback" not in missing.stderr
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    r = run_cli("--config", str(binary), "snapshot")
    assert r.returncode == 2 and "UTF-8" in r.stderr


FLEET = '''
pipeline = "fleet"
[boxes.a]
url = "local"
workspace = "/tmp/samai-fleet-a"
[boxes.b]
url = "ssh://me@127.0.0.1:2222"
workspace = "samai/b"
poll_interval = 2.0
[stages.train]
key = "3"
command = "python -m train"
nodes = ["a", "b"]
launcher = "torchrun"
'''


def test_a_fleet_of_boxes_and_a_multi_node_stage() -> None:
    cfg = config.parse(FLEET, "fleet.toml")
    assert [(b.name, b.target.url, b.workspace) for b in cfg.boxes] == [
        ("a", "local", "/tmp/samai-fleet-a"), ("b", "ssh://me@127.0.0.1:2222", "samai/b")]
    assert (cfg.target, cfg.workspace) == (cfg.boxes[0].target, cfg.boxes[0].workspace)  # the first box opens
    assert cfg.boxes[1].target.poll_interval == 2.0 and cfg.on_box("b").workspace == "samai/b"
    assert (cfg.stage("train").nodes, cfg.stage("train").launcher) == (("a", "b"), "torchrun")
    assert config.parse(FLEET.split("[boxes.a]")[0] + '[target]\nurl = "local"\n', "one.toml").boxes == ()


@pytest.mark.parametrize("edit, key, said", [
    (('nodes = ["a", "b"]', 'nodes = ["a", "c"]'), "stages.train.nodes", "(declared: a, b)"),
    (('nodes = ["a", "b"]', 'nodes = ["a", "a"]'), "stages.train.nodes", "each box once"),
    (('launcher = "torchrun"', 'launcher = "mpirun"'), "stages.train.launcher", "torchrun or deepspeed"),
    (('launcher = "torchrun"', ""), "stages.train.launcher", "nodes and launcher together"),
    (('url = "ssh://me@127.0.0.1:2222"', 'url = "ftp://x"'), "boxes.b.url", "ssh://user@host"),
    (('workspace = "samai/b"\n', ""), "boxes.b.workspace", "workspace path"),
    (("poll_interval = 2.0", "poll = 2.0"), "boxes.b.poll", "one of the keys"),
    (("[boxes.b]", "[boxes.'b/../x']"), "boxes.b/../x", "a box name"),
    (('pipeline = "fleet"', 'pipeline = "fleet"\n[target]\nurl = "local"'), "boxes", "not both"),
])
def test_fleet_mistakes_name_the_key(edit: tuple[str, str], key: str, said: str) -> None:
    with pytest.raises(config.ConfigError) as e:
        config.parse(FLEET.replace(*edit), "fleet.toml")
    assert f"fleet.toml: {key}" in str(e.value) and said in str(e.value)
