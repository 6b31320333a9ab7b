"""The console knows the projector (issue 20, §10): `check gguf` reads an mmproj file's clip keys,
the preflight refuses a serve stage whose projector is missing, no projector, or of another width
than its model, `doctor` flags a multimodal pipeline's llama-server without --mmproj, `check eval`
flags images sent over the cap, and `[model] mmproj` must name an artifact. The GGUFs are written
by gguf-py's GGUFWriter with the keys llama.cpp's converter writes; the box, the processes and
the CLI are real."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.audit import AuditLog
from samai.console.core.checks import check_gguf
from samai.console.core.evals.check import IMAGE_CAP, check_eval
from samai.console.core.mmproj import ServeCommand, has_mmproj, serve_command
from samai.console.core.preflight import poison_artifacts, preflight
from samai.remote.box.gguf_check import check, check_file, summary
from tests.box_tools import stage_argv, stage_env
from tests.chatserver import serving
from tests.helpers import run_cli, wait_for

# What convert_hf_to_gguf.py --mmproj writes for a Qwen2.5-VL vision tower (tiny sizes).
CLIP_KEYS: dict[str, tuple[str, object]] = {
    "general.type": ("string", "mmproj"),
    "clip.has_vision_encoder": ("bool", True),
    "clip.projector_type": ("string", "qwen2.5vl_merger"),
    "clip.use_silu": ("bool", True),
    "clip.vision.projection_dim": ("u32", 64),
    "clip.vision.image_size": ("u32", 560),
    "clip.vision.patch_size": ("u32", 14),
    "clip.vision.embedding_length": ("u32", 32),
    "clip.vision.feed_forward_length": ("u32", 64),
    "clip.vision.block_count": ("u32", 4),
    "clip.vision.attention.head_count": ("u32", 2),
    "clip.vision.attention.layer_norm_epsilon": ("f32", 1e-6),
    "clip.vision.n_wa_pattern": ("u32", 2),
    "clip.vision.spatial_merge_size": ("u32", 2),
    "clip.vision.image_mean": ("array", [0.48145466, 0.4578275, 0.40821073]),
    "clip.vision.image_std": ("array", [0.26862954, 0.26130258, 0.27577711]),
}
ADDERS = {"string": "add_string", "bool": "add_bool", "u32": "add_uint32", "i32": "add_int32", "f32": "add_float32",
          "array": "add_array"}


def write_gguf(path: Path, arch: str, keys: dict[str, tuple[str, object]], tensors: dict[str, np.ndarray]) -> Path:
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    for key, (kind, value) in keys.items():
        getattr(w, ADDERS[kind])(key, value)
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_mmproj(path: Path, projection_dim: int = 64, **changes: tuple[str, object] | None) -> Path:
    """A projector feeding projection_dim-wide embeddings; changes: a key (dots as __) set, or dropped with None."""
    keys = dict(CLIP_KEYS, **{"clip.vision.projection_dim": ("u32", projection_dim)})
    for name, change in changes.items():
        key = name.replace("__", ".")
        if change is None:
            keys.pop(key)
        else:
            keys[key] = change
    tensors = {"v.patch_embd.weight": np.zeros((32, 3 * 14 * 14), dtype=np.float16),
               "v.blk.0.attn_q.weight": np.zeros((32, 32), dtype=np.float16),
               "mm.0.weight": np.zeros((128, 128), dtype=np.float16),
               "mm.2.weight": np.zeros((projection_dim, 128), dtype=np.float16),
               "mm.2.bias": np.zeros(projection_dim, dtype=np.float32)}
    return write_gguf(path, "clip", keys, tensors)


def write_text_model(path: Path, embedding: int = 64, arch: str = "qwen2vl", filler: int = 0) -> Path:
    """A Qwen2-VL text model whose embedding size is `embedding` (filler: that many KVs before it)."""
    keys: dict[str, tuple[str, object]] = {f"test.filler.{i}": ("u32", i) for i in range(filler)}
    keys.update({f"{arch}.context_length": ("u32", 256), f"{arch}.embedding_length": ("u32", embedding),
                 f"{arch}.block_count": ("u32", 2), f"{arch}.feed_forward_length": ("u32", 172),
                 "tokenizer.ggml.tokens": ("array", [f"<t{i}>" for i in range(16)])})
    tensors = {"token_embd.weight": np.zeros((16, embedding), dtype=np.float32),
               "output_norm.weight": np.ones(embedding, dtype=np.float32)}
    return write_gguf(path, arch, keys, tensors)


def codes(result: dict) -> list[str]:
    return [p["code"] for p in result["problems"]]


# ------------------------------------------------------------------------------------------------
# check gguf


@pytest.mark.slow
def test_a_projector_is_reported_with_its_clip_figures(tmp_path: Path) -> None:
    path = write_mmproj(tmp_path / "vlm-mmproj-f16.gguf")
    r = check_file(path)
    assert r["ok"] and r["problems"] == [] and r["architecture"] == "clip" and r["embedding_length"] is None
    assert r["projector"] == {"projector_type": "qwen2.5vl_merger", "has_vision_encoder": True, "projection_dim": 64,
                              "image_size": 560, "patch_size": 14, "embedding_length": 32, "block_count": 4}
    assert "projector (mmproj): type qwen2.5vl_merger, projection_dim 64" in summary(str(path), r)
    done = run_cli("check", "gguf", str(path), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["projector"]["projection_dim"] == 64
    text = run_cli("check", "gguf", str(path))
    assert text.returncode == 0 and "architecture clip" in text.stdout
    assert "projector (mmproj): type qwen2.5vl_merger, projection_dim 64" in text.stdout
    assert "4 vision blocks" in text.stdout and "image 560 px, patch 14 px" in text.stdout


@pytest.mark.parametrize(("changes", "expected"), [
    ({"clip__projector_type": None}, ["no_projector_type"]),
    ({"clip__has_vision_encoder": None}, ["no_vision_encoder"]),
    ({"clip__has_vision_encoder": ("bool", False)}, ["no_vision_encoder"]),
    ({"clip__vision__projection_dim": None}, ["no_projection_dim"]),
    ({"clip__vision__projection_dim": ("i32", 64)}, ["bad_projector_kv", "no_projection_dim"]),
    ({"clip__projector_type": None, "clip__vision__projector_type": ("string", "qwen2.5vl_merger")}, []),
])
def test_what_the_clip_loader_refuses_is_named(tmp_path: Path, changes: dict, expected: list[str]) -> None:
    path = write_mmproj(tmp_path / "mmproj.gguf", **changes)
    r = check_file(path)
    assert codes(r) == expected and r["ok"] is not expected and r["projector"] is not None
    done = run_cli("check", "gguf", str(path))
    assert done.returncode == (1 if expected else 0) and all(code in done.stdout for code in expected)


def test_a_text_model_has_its_embedding_size_and_no_projector(tmp_path: Path) -> None:
    r = check_file(write_text_model(tmp_path / "vlm-q8_0.gguf", embedding=64))
    assert r["ok"] and (r["architecture"], r["embedding_length"], r["projector"]) == ("qwen2vl", 64, None)


def test_the_embedding_size_is_read_after_many_other_keys(tmp_path: Path) -> None:
    """More KVs before it than the result keeps by default: the figure a match needs is kept anyway."""
    r = check_file(write_text_model(tmp_path / "wordy.gguf", embedding=96, filler=100))
    assert r["ok"] and r["embedding_length"] == 96


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_real_text_ggufs_pass_as_before_with_their_embedding_size() -> None:
    from tests.gguf_artifacts import gemma_q4_k_m, llama_vocab_files

    vocabs = llama_vocab_files()
    for path in vocabs:
        r = check_file(path)
        assert r["ok"] and r["problems"] == [] and r["projector"] is None, path
    for path in (p for p in vocabs if p.stem in ("ggml-vocab-llama-spm", "ggml-vocab-bert-bge", "ggml-vocab-phi-3")):
        reader = GGUFReader(str(path))  # the oracle
        arch = reader.fields["general.architecture"].contents()
        assert check_file(path)["embedding_length"] == reader.fields[f"{arch}.embedding_length"].contents()
    gemma = check_file(gemma_q4_k_m())
    assert gemma["ok"] and gemma["projector"] is None
    assert (gemma["architecture"], gemma["embedding_length"]) == ("gemma3", 640)  # Gemma 3 270M's hidden size


async def test_the_console_reads_a_projector_remotely_as_locally(box, tmp_path: Path) -> None:
    path = str(write_mmproj(tmp_path / "mmproj.gguf"))
    local = await check_gguf(box, path, expect_tensors=None, expect_last=None, local=True)
    remote = await check_gguf(box, path, expect_tensors=None, expect_last=None, local=False)
    assert local.to_json() == remote.to_json() and local.projector and local.projector.projection_dim == 64


# ------------------------------------------------------------------------------------------------
# config

MODEL = "gguf/vlm-q8_0.gguf"
MMPROJ = "gguf/vlm-mmproj-f16.gguf"
SERVE = (f"python3 -m samai_box.stages.serve --model {MODEL} {{mmproj}}--port {{port}} "
         "--llama-server venv/llama.cpp/bin/llama-server")


def pipeline(workspace: Path, *, mmproj_key: str = 'mmproj = "gguf_mmproj"', flag: str = f"--mmproj {MMPROJ} ",
             needs: str = '["gguf_q", "gguf_mmproj"]', port: int = 1) -> str:
    return f"""
[workspace]
path = "{workspace}"
[budget]
reserve_gb = 0
[model]
architecture = "Qwen2_5_VLForConditionalGeneration"
{mmproj_key}
[artifacts.gguf_q]
path = "{MODEL}"
size_gb = 0.00001
[artifacts.gguf_mmproj]
path = "{MMPROJ}"
size_gb = 0.00001
[stages.convert]
key = "5"
command = "python3 -m samai_box.stages.convert --model models/merged --out gguf/vlm-f16.gguf --mmproj {MMPROJ}"
makes = ["gguf_mmproj"]
[stages.serve]
key = "7"
command = "{SERVE.format(mmproj=flag, port=port)}"
needs = {needs}
ports = [{port}]
"""


def load(tmp_path: Path, text: str) -> config.Config:
    f = tmp_path / "vlm.toml"
    f.write_text(text)
    return config.load(f)


@pytest.mark.parametrize("value", ['"gguf_projector"', '"models/mmproj.gguf"', "3", '["gguf_mmproj"]'])
def test_model_mmproj_must_name_a_declared_artifact(tmp_path: Path, workspace: Path, value: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        load(tmp_path, pipeline(workspace, mmproj_key=f"mmproj = {value}"))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'vlm.toml'}: model.mmproj: expected the name of an [artifacts.NAME] table")
    assert "declared: gguf_q, gguf_mmproj" in message and "got" in message
    done = run_cli("--config", str(tmp_path / "vlm.toml"), "budget")
    assert done.returncode == 2 and "model.mmproj" in done.stderr


def test_a_model_mmproj_naming_an_artifact_loads(tmp_path: Path, workspace: Path) -> None:
    cfg = load(tmp_path, pipeline(workspace))
    assert dict(cfg.model)["mmproj"] == "gguf_mmproj"


# ------------------------------------------------------------------------------------------------
# preflight, through the fire's real plan


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def plan_checks(box, tmp_path: Path, workspace: Path, stage: str = "serve",
                      **options) -> tuple[bool, list[tuple[str, str]]]:
    from samai.console.core.actions import Actions

    async def never(plan):
        raise AssertionError("a plan is not confirmed here")

    cfg = load(tmp_path, pipeline(workspace, port=free_port(), **options))
    actions = Actions(box, cfg, AuditLog(tmp_path / "audit.jsonl"), readonly=False, confirm=never)
    plan = await actions.plan_fire(stage)
    return plan.blocked, [(c.severity, c.text) for c in plan.checks]


def place(workspace: Path, model_width: int | None = 64, mmproj_width: int | None = 64) -> None:
    (workspace / "gguf").mkdir(exist_ok=True)
    if model_width is not None:
        write_text_model(workspace / MODEL, embedding=model_width)
    if mmproj_width is not None:
        write_mmproj(workspace / MMPROJ, projection_dim=mmproj_width)


async def test_a_matching_projector_passes_the_preflight(box, tmp_path: Path, workspace: Path) -> None:
    place(workspace, 64, 64)
    blocked, checks = await plan_checks(box, tmp_path, workspace)
    assert not blocked, checks
    assert ("ok", f"mmproj {MMPROJ} (qwen2.5vl_merger) matches model {MODEL}: embedding size 64") in checks


@pytest.mark.slow
async def test_a_projector_of_another_width_blocks_the_serve_stage(box, tmp_path: Path, workspace: Path) -> None:
    place(workspace, model_width=64, mmproj_width=128)
    blocked, checks = await plan_checks(box, tmp_path, workspace)
    errors = [text for severity, text in checks if severity == "error"]
    assert blocked and len(errors) == 1, checks
    assert all(s in errors[0] for s in (MMPROJ, MODEL, "clip.vision.projection_dim is 128",
                                        "qwen2vl.embedding_length is 64"))
    # The command line shows the same refusal, and runs nothing.
    done = run_cli("--config", str(tmp_path / "vlm.toml"), "fire", "serve")
    assert done.returncode == 1 and "✗ mmproj" in done.stderr and "projection_dim is 128" in done.stderr
    assert "preflight blocks it" in done.stdout + done.stderr and not (workspace / ".samai" / "state").exists()


async def test_a_missing_projector_is_said_once_and_blocks(box, tmp_path: Path, workspace: Path) -> None:
    place(workspace, 64, None)
    blocked, checks = await plan_checks(box, tmp_path, workspace)
    errors = [text for severity, text in checks if severity == "error"]
    assert blocked and errors == [f"needs gguf_mmproj ({MMPROJ}): missing"], checks
    # Not a declared need: the preflight says it itself, from the same snapshot.
    blocked, checks = await plan_checks(box, tmp_path, workspace, needs='["gguf_q"]')
    errors = [text for severity, text in checks if severity == "error"]
    assert blocked and errors == [f"mmproj {MMPROJ} (artifact gguf_mmproj, the projector GGUF): missing"], checks


async def test_a_text_model_given_as_the_projector_blocks(box, tmp_path: Path, workspace: Path) -> None:
    place(workspace, 64, None)
    write_text_model(workspace / MMPROJ, embedding=64)
    blocked, checks = await plan_checks(box, tmp_path, workspace)
    assert blocked and any(severity == "error" and f"mmproj {MMPROJ} is not a projector" in text
                           and "'qwen2vl'" in text for severity, text in checks), checks


async def test_a_broken_projector_blocks_with_its_problem(box, tmp_path: Path, workspace: Path) -> None:
    place(workspace, 64, None)
    write_mmproj(workspace / MMPROJ, clip__has_vision_encoder=("bool", False))
    blocked, checks = await plan_checks(box, tmp_path, workspace)
    assert blocked and any(severity == "error" and "no_vision_encoder" in text for severity, text in checks), checks


async def test_a_multimodal_serve_without_mmproj_is_refused(box, tmp_path: Path, workspace: Path) -> None:
    place(workspace, 64, 64)
    blocked, checks = await plan_checks(box, tmp_path, workspace, flag="")
    assert blocked and any(severity == "error" and "without --mmproj gguf/vlm-mmproj-f16.gguf" in text
                           for severity, text in checks), checks
    # The stage bar's preflight (the snapshot alone) says it too.
    cfg = load(tmp_path, pipeline(workspace, flag=""))
    snap = await box.snapshot(artifacts=[(a.name, a.path) for a in cfg.artifacts] + poison_artifacts(cfg))
    serve = cfg.stage("serve")
    assert serve is not None and preflight(cfg, snap, serve).blocked


async def test_an_undeclared_projector_path_is_read_from_the_command(box, tmp_path: Path, workspace: Path) -> None:
    """--mmproj on a path no artifact declares, in a pipeline without [model] mmproj: still matched."""
    place(workspace, 64, None)
    write_mmproj(workspace / "gguf" / "other.gguf", projection_dim=80)
    blocked, checks = await plan_checks(box, tmp_path, workspace, mmproj_key="", flag="--mmproj gguf/other.gguf ",
                                        needs='["gguf_q"]')
    assert blocked and any("projection_dim is 80" in text for _, text in checks), checks
    (workspace / "gguf" / "other.gguf").unlink()
    blocked, checks = await plan_checks(box, tmp_path, workspace, mmproj_key="", flag="--mmproj gguf/other.gguf ",
                                        needs='["gguf_q"]')
    assert blocked and any(text.startswith("mmproj gguf/other.gguf cannot be read") for _, text in checks), checks


async def test_the_stage_that_writes_the_projector_is_not_checked_for_it(box, tmp_path: Path,
                                                                        workspace: Path) -> None:
    """convert names the --mmproj it writes and runs no server: nothing to match, nothing missing."""
    blocked, checks = await plan_checks(box, tmp_path, workspace, stage="convert")
    assert not blocked and not any("mmproj" in text for _, text in checks), checks


async def test_a_text_pipeline_serve_stage_has_no_projector_checks(box, tmp_path: Path, workspace: Path) -> None:
    place(workspace, 64, None)
    blocked, checks = await plan_checks(box, tmp_path, workspace, mmproj_key="", flag="", needs='["gguf_q"]')
    assert not blocked and not any("mmproj" in text for _, text in checks), checks


@pytest.mark.parametrize(("command", "model", "mmproj", "runs"), [
    (SERVE.format(mmproj=f"--mmproj {MMPROJ} ", port=1), MODEL, MMPROJ, True),
    ("llama-server -m m.gguf -mm p.gguf --port 1", "m.gguf", "p.gguf", True),
    ("/opt/bin/llama-server --model=m.gguf --mmproj=p.gguf", "m.gguf", "p.gguf", True),
    ("python3 -u -m samai_box.stages.eval --url http://127.0.0.1:1", None, None, False),
    ("llama-server -m 'unbalanced", None, None, False),
])
def test_the_serve_options_are_read_from_the_command(command: str, model, mmproj, runs: bool) -> None:
    assert serve_command(command) == ServeCommand(model, mmproj, runs)


# ------------------------------------------------------------------------------------------------
# doctor


@pytest.mark.slow
def test_doctor_flags_a_multimodal_server_without_mmproj(tmp_path: Path, workspace: Path, spawn) -> None:
    fake = workspace / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    fake.chmod(0o755)
    blind = spawn(str(fake), "-m", MODEL, "--reasoning-format", "none")
    seeing = spawn(str(fake), "-m", MODEL, "--mmproj", MMPROJ, "--reasoning-format", "none")
    text = tmp_path / "text.toml"
    text.write_text(pipeline(workspace, mmproj_key=""))
    multimodal = tmp_path / "vlm.toml"
    multimodal.write_text(pipeline(workspace))

    def findings(cfg: Path) -> list[dict]:
        done = run_cli("--config", str(cfg), "doctor", "--json")
        return [f for f in json.loads(done.stdout)["findings"] if f["code"] == "serve_without_mmproj"]

    def about(found: list[dict], pid: int) -> list[dict]:  # other servers on this machine may be found too
        return [f for f in found if f"pid {pid} " in f["message"]]

    found = wait_for(lambda: about(findings(multimodal), blind.pid), timeout=60)
    assert [f["severity"] for f in found] == ["error"]
    assert f"pid {blind.pid} runs without --mmproj" in found[0]["message"]
    assert "gguf_mmproj" in found[0]["message"] and found[0]["action"].startswith(f"kill {blind.pid} ")
    assert about(findings(multimodal), seeing.pid) == []
    assert findings(text) == []  # a text pipeline's server needs no projector


@pytest.mark.parametrize(("argv", "loads"), [
    (["llama-server", "-m", "m.gguf"], False),
    (["llama-server", "-m", "m.gguf", "--mmproj", "p.gguf"], True),
    (["llama-server", "-m", "m.gguf", "-mm", "p.gguf"], True),
    (["llama-server", "-m", "m.gguf", "--mmproj=p.gguf"], True),
    (["llama-server", "--mmproj-url", "http://x/p.gguf"], True),
    (["llama-server", "-hf", "org/model-GGUF"], True),  # its projector is downloaded beside it
    (["llama-server", "-hf", "org/model-GGUF", "--no-mmproj"], False),
])
def test_a_projector_is_read_off_a_server_command_line(argv: list[str], loads: bool) -> None:
    assert has_mmproj(argv) is loads


# ------------------------------------------------------------------------------------------------
# check eval


def item(i: int, image: object = None, **extra: object) -> str:
    record: dict[str, object] = {"id": i, "prompt": "What colour is the square?", "gold": "red", "pred": "red",
                                 "correct": True, "finish_reason": "stop", "content": "red", "reasoning_content": ""}
    if image is not None:
        record["image"] = image
    record.update(extra)
    return json.dumps(record)


def image(width: int, height: int, sent: tuple[int, int] | None = None) -> dict:
    sw, sh = sent or (width, height)
    return {"path": "data/eval/images/0.png", "width": width, "height": height, "sent_width": sw, "sent_height": sh,
            "sent_bytes": 1234, "resized": (sw, sh) != (width, height)}


def test_images_sent_over_the_cap_are_a_warning_with_the_count_and_the_largest() -> None:
    lines = [item(0, image(448, 448)), item(1, image(1500, 900)), item(2, image(900, 2000)),
             item(3, image(3000, 2000, sent=(1120, 747))), item(4)]
    result = check_eval(lines)
    over = [p for p in result.problems if p.code == "image_over_cap"]
    assert len(over) == 1 and over[0].severity == "warning" and over[0].count == 2
    assert "2/4 (50 %) images" in over[0].message and "largest 900x2000" in over[0].message
    assert f"over {IMAGE_CAP} px" in over[0].message
    assert (result.images, result.over_cap, result.largest_over) == (4, 2, (900, 2000))
    assert result.to_json()["largest_over"] == [900, 2000] and result.accuracy == 1.0


def test_images_within_the_cap_are_no_problem() -> None:
    result = check_eval([item(0, image(IMAGE_CAP, 600)), item(1, image(4000, 3000, sent=(IMAGE_CAP, 840)))])
    assert result.problems == () and (result.images, result.over_cap) == (2, 0)


def test_an_image_record_without_the_sent_size_is_judged_only_when_it_was_sent_as_it_is() -> None:
    as_is = {"path": "a.png", "width": 2000, "height": 100, "resized": False}
    unknown = {"path": "b.png", "width": 2000, "height": 100}
    result = check_eval([item(0, as_is), item(1, unknown)])
    assert (result.images, result.over_cap, result.largest_over) == (1, 1, (2000, 100))


@pytest.mark.parametrize("garbage", [
    "a.png", 7, [1120, 2000], {"sent_width": "2000", "sent_height": 10}, {"sent_width": True, "sent_height": 2000},
    {"sent_width": -5, "sent_height": 2000}, {"sent_width": 10 ** 30, "sent_height": None}, {"resized": False},
    {"width": 2.5e9, "height": 1, "resized": False}, {}, None,
])
def test_garbage_image_records_never_crash_the_check(garbage: object) -> None:
    result = check_eval([item(0, {"wrap": 1}), json.dumps({"id": 1, "gold": "red", "pred": "red", "image": garbage})])
    json.dumps(result.to_json(), allow_nan=False)
    assert result.n == 2 and result.over_cap == 0


@pytest.fixture
def chat_url() -> Iterator[str]:
    with serving() as server:
        yield server.url


@pytest.mark.slow
@pytest.mark.parametrize(("cap", "over"), [(2000, 1), (None, 0)])
def test_check_eval_reads_what_the_real_eval_stage_sent(chat_url: str, tmp_path: Path, cap, over: int) -> None:
    """The eval stage run with a cap over the playbook's sends a 1500 px image as it is: flagged;
    with its default cap it sends it resized to 1120: not flagged."""
    from PIL import Image

    data = tmp_path / "eval"
    data.mkdir()
    Image.new("RGB", (1500, 40), "red").save(data / "wide.png")
    Image.new("RGB", (64, 64), "red").save(data / "small.png")
    (data / "eval.jsonl").write_text("".join(json.dumps({"id": i, "prompt": "What colour?", "gold": "red",
                                                         "image": name}) + "\n"
                                             for i, name in enumerate(("wide.png", "small.png"))))
    argv = stage_argv("stages.eval", "--url", chat_url, "--data", data / "eval.jsonl", "--out", tmp_path / "out",
                      "--max-tokens", 8, "--timeout", 10, "--extract", "first-word",
                      *(("--image-cap", cap) if cap else ()))
    done = subprocess.run(argv, env=stage_env(), capture_output=True, text=True, timeout=120)
    assert "EVAL_RC=0" in done.stdout, done.stdout + done.stderr
    result = check_eval((tmp_path / "out" / "items.jsonl").read_text().splitlines())
    assert (result.n, result.images, result.over_cap) == (2, 2, over)
    assert [p.code for p in result.problems] == ["image_over_cap"] * over
    if over:
        assert "largest 1500x40" in result.problems[0].message
    done = run_cli("check", "eval", str(tmp_path / "out" / "items.jsonl"))
    assert done.returncode == 0 and ("image_over_cap" in done.stdout) is bool(over)


@pytest.fixture(scope="module")
def projector_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf").read_bytes()


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 1200), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.none() | st.integers(0, 1400))
def test_a_corrupt_projector_never_crashes_the_check(projector_bytes: bytes, edits, cut) -> None:
    """Bytes of its header overwritten (a type, a length, a value) or the file cut: a result, never a crash."""
    from samai.console.core.checks import Projector

    data = bytearray(projector_bytes)
    for at, value in edits:
        data[at] = value
    data = data[:cut] if cut is not None else data

    def read_at(offset: int, length: int) -> bytes:
        return bytes(data[offset:offset + length])

    result = check(read_at, len(data))
    json.dumps(result, allow_nan=False)
    assert result["ok"] == (not result["problems"])
    if result["projector"] is not None:
        assert result["architecture"] == "clip" and Projector.from_raw(result["projector"]) is not None


@pytest.mark.slow
def test_surgery_fixes_a_projector_that_check_gguf_refuses(tmp_path: Path, workspace: Path) -> None:
    """A projector without clip.projector_type is a sound GGUF: set-kv takes it as its input, and
    what it writes passes check gguf as a projector."""
    write_mmproj(workspace / "mmproj.gguf", clip__projector_type=None)
    cfg = tmp_path / "surgery.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n')
    before = run_cli("--config", str(cfg), "check", "gguf", "mmproj.gguf")
    assert before.returncode == 1 and "no_projector_type" in before.stdout
    done = run_cli("--config", str(cfg), "gguf", "set-kv", "mmproj.gguf", "clip.projector_type=qwen2.5vl_merger",
                   "--type", "str", "--out", "fixed.gguf", "--yes", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    after = check_file(workspace / "fixed.gguf")
    assert after["ok"] and after["projector"]["projector_type"] == "qwen2.5vl_merger"
    # A write that leaves the projector incomplete is still a sound write: check gguf says the rest.
    done = run_cli("--config", str(cfg), "gguf", "set-kv", "mmproj.gguf", "general.name=renamed",
                   "--out", "renamed.gguf", "--yes", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert codes(check_file(workspace / "renamed.gguf")) == ["no_projector_type"]


# ------------------------------------------------------------------------------------------------
# the shipped multimodal pipelines


def shipped(name: str) -> config.Config:
    from importlib import resources

    text = resources.files("samai.console").joinpath("pipelines", f"{name}.toml").read_text("utf-8")
    return config.parse(text, f"(built-in {name})")


@pytest.mark.parametrize("name", ["vlm-tiny", "samai-vl"])
def test_the_shipped_multimodal_pipelines_have_one_projector_stage(name: str) -> None:
    from samai.console.core.mmproj import mmproj_artifact, projector_stage

    cfg = shipped(name)
    artifact, model = mmproj_artifact(cfg), cfg.artifact("gguf_q")
    assert artifact is not None and model is not None
    found = {s.name: projector_stage(cfg, s) for s in cfg.stages if projector_stage(cfg, s)}
    assert list(found) == ["serve"] and found["serve"] == ServeCommand(model.path, artifact.path, True)


async def test_the_tiny_vlm_serve_stage_is_matched_through_its_own_config(box, tmp_path: Path,
                                                                           workspace: Path) -> None:
    from dataclasses import replace

    from samai.console.core.actions import Actions

    async def never(plan):
        raise AssertionError("a plan is not confirmed here")

    cfg = replace(shipped("vlm-tiny"), workspace=str(workspace))
    width = dict(cfg.model)["hidden_size"]
    actions = Actions(box, cfg, AuditLog(tmp_path / "audit.jsonl"), readonly=False, confirm=never)
    place(workspace, width, width)
    checks = [(c.severity, c.text) for c in (await actions.plan_fire("serve")).checks]
    assert ("ok", f"mmproj {MMPROJ} (qwen2.5vl_merger) matches model {MODEL}: embedding size {width}") in checks
    place(workspace, width, 2 * width)
    plan = await actions.plan_fire("serve")
    assert plan.blocked and any(f"projection_dim is {2 * width}" in c.text for c in plan.checks)
