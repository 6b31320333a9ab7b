"""The multimodal pipeline's pieces that need no ML stack: the configs, the disk budget of its two
artifacts, and the box helpers that read untrusted training data (paths, image places, names).
The stages themselves run end to end on the real tiny VLM in tests/test_pipeline.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from samai.console.core import config
from samai.console.core.disk.budget import GB, plan_run
from samai.remote.box.stages import vision
from samai.remote.box.stages.images import inside


@pytest.mark.parametrize("name", ["vlm-tiny", "samai-vl"])
def test_the_vlm_pipelines_make_and_serve_both_artifacts(name: str) -> None:
    cfg = config.load_builtin(name)
    assert dict(cfg.model)["mmproj"] == "gguf_mmproj"
    convert, serve, train = cfg.stage("convert"), cfg.stage("serve"), cfg.stage("train")
    assert set(convert.makes) == {"gguf_f16", "gguf_mmproj"} and "--mmproj" in convert.command
    assert "gguf_mmproj" in serve.needs and "--mmproj" in serve.command and "--smoke-image" in serve.command
    assert f'--lora-regex "{vision.LORA_REGEX}"' in train.command


def test_the_disk_budget_counts_the_projector_beside_the_model() -> None:
    cfg = config.load_builtin("samai-vl")
    peaks = {p.stage: p for p in plan_run(cfg, 57 * GB)}
    assert {"gguf_f16", "gguf_mmproj", "merged"} <= set(peaks["convert"].alive)
    assert {"gguf_q", "gguf_mmproj"} <= set(peaks["serve"].alive) and "gguf_f16" not in peaks["serve"].alive
    sizes = {a.name: a.size_gb for a in cfg.artifacts}
    assert sizes["gguf_mmproj"] == 1.4
    assert abs(peaks["serve"].peak / GB - sum(sizes[a] for a in peaks["serve"].alive)) < 0.01


@pytest.mark.parametrize("name, group", [
    ("model.visual.blocks.0.mlp.gate_proj.weight", "vision"),
    ("base_model.model.model.visual.blocks.3.attn.qkv", "vision"),
    ("model.visual.merger.mlp.0.weight", "merger"),
    ("model.language_model.layers.1.mlp.gate_proj.weight", "language"),
    ("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.default.weight", "language"),
    ("lm_head.weight", "lm_head"),
    ("model.multi_modal_projector.linear_1.weight", "merger"),
    ("model.vision_tower.encoder.layers.0.self_attn.q_proj.weight", "vision"),
])
def test_parameter_groups_by_name(name: str, group: str) -> None:
    assert vision.group_of(name) == group


def test_the_lora_regex_takes_the_language_models_projections_only() -> None:
    import re

    regex = re.compile(vision.LORA_REGEX)
    assert regex.fullmatch("model.language_model.layers.0.mlp.gate_proj")
    assert regex.fullmatch("model.language_model.layers.1.self_attn.o_proj")
    assert not regex.fullmatch("model.visual.blocks.0.mlp.gate_proj")  # the ViT's own gate/up/down
    assert not regex.fullmatch("model.visual.merger.mlp.0")


def test_image_paths_stay_inside_the_data_folder(tmp_path: Path) -> None:
    (tmp_path / "data" / "images").mkdir(parents=True)
    (tmp_path / "secret.png").write_bytes(b"x")
    os.symlink(tmp_path / "secret.png", tmp_path / "data" / "images" / "link.png")
    data = str(tmp_path / "data")
    assert inside(data, "images/a.png") == str(tmp_path / "data" / "images" / "a.png")
    for bad in ("../secret.png", "/etc/passwd", "images/../../secret.png", "images/link.png"):
        with pytest.raises(ValueError):
            inside(data, bad)


@given(st.text(max_size=40))
def test_no_image_path_leaves_the_folder(relative: str) -> None:
    root = "/srv/ws/data"
    try:
        path = inside(root, relative)
    except ValueError:
        return
    assert os.path.commonpath([os.path.realpath(root), path]) == os.path.realpath(root)


@given(st.lists(st.integers(0, 50), max_size=5), st.lists(st.text(max_size=8), max_size=6))
def test_image_pads_expand_one_run_per_image(counts: list[int], texts: list[str]) -> None:
    texts = [t.replace(vision.IMAGE_PAD, "") for t in texts]
    pieces = texts[:len(counts) + 1] + [""] * (len(counts) + 1 - len(texts[:len(counts) + 1]))
    text = vision.IMAGE_PAD.join(pieces)
    expanded = vision.expand_image_pads(text, counts)
    assert expanded.count(vision.IMAGE_PAD) == sum(counts)
    assert expanded.replace(vision.IMAGE_PAD, "") == "".join(pieces)
    with pytest.raises(ValueError):
        vision.expand_image_pads(text, counts + [1])
