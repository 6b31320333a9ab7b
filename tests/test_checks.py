"""`samai-console check gguf|trainlog|eval` on real files, through the Box."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from tests.helpers import run_cli

GB = 1 << 30


def write_gguf(path: Path, tensors: int = 3) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_name("check-test")
    for i in range(tensors):
        w.add_tensor(f"blk.{i}.weight", np.full((8, 32), i, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sparse_gguf(path: Path, size_bytes: int) -> Path:
    """A real header describing one huge Q8_0 tensor whose data is a hole in the file."""
    w = GGUFWriter(str(path), "llama")
    blocks = size_bytes // 34
    w.add_tensor_info("token_embd.weight", (blocks * 34,), np.dtype(np.uint8), blocks * 34,
                      raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as f:
        header_end = f.seek(0, 2)
        f.truncate(((header_end + 31) // 32) * 32 + blocks * 34)
    return path


def check(*args: str) -> tuple[int, dict]:
    r = run_cli("check", *args, "--json")
    return r.returncode, (json.loads(r.stdout) if r.stdout else {"stderr": r.stderr})


def test_a_good_gguf(tmp_path: Path) -> None:
    rc, result = check("gguf", str(write_gguf(tmp_path / "ok.gguf")))
    assert rc == 0 and result["ok"] and result["tensor_count"] == 3 and result["last_tensor"] == "blk.2.weight"
    assert result["expected_size"] == result["size"] and result["data_offset"] % 32 == 0
    assert list(result) == ["path", "ok", "size", "version", "tensor_count", "kv_count", "alignment", "header_end",
                            "data_offset", "data_end", "expected_size", "size_note", "last_tensor", "bytes_read",
                            "deep", "problems", "architecture", "embedding_length",
                            "projector"]  # the JSON contract's order


@pytest.mark.slow
def test_gguf_problems_have_their_codes(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "ok.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[:-100])
    (tmp_path / "more.gguf").write_bytes(good + b"\0" * 4096)
    (tmp_path / "lfs.gguf").write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n")
    patched = bytearray(good)
    patched[17:25] = patched[16:24]  # kv_count written one byte off: the playbook's incident
    (tmp_path / "off.gguf").write_bytes(bytes(patched))
    for name, code in (("cut", "truncated"), ("more", "oversize"), ("lfs", "lfs_pointer"), ("off", "absurd_count")):
        rc, result = check("gguf", str(tmp_path / f"{name}.gguf"))
        assert rc == 1 and code in [p["code"] for p in result["problems"]], (name, result)
    rc, result = check("gguf", str(tmp_path / "ok.gguf"), "--expect-tensors", "4", "--expect-last", "blk.9.weight")
    assert rc == 1 and {p["code"] for p in result["problems"]} == {"tensor_count_mismatch", "last_tensor_mismatch"}
    assert [list(p) for p in result["problems"]] == [["code", "message", "severity"]] * 2


def test_an_unreadable_gguf_is_exit_2(tmp_path: Path) -> None:
    r = run_cli("check", "gguf", str(tmp_path / "absent.gguf"))
    assert r.returncode == 2 and "No such file" in r.stderr and r.stderr.count("\n") == 1


def test_a_multi_gigabyte_gguf_costs_a_few_kilobytes(tmp_path: Path) -> None:
    big = sparse_gguf(tmp_path / "big.gguf", 3 * GB)
    assert big.stat().st_size > 3 * GB - 64 and big.stat().st_blocks * 512 < 1 << 20  # sparse: no data
    rc, result = check("gguf", str(big))
    assert rc == 0, result
    assert result["ok"] and result["bytes_read"] <= 128 * 1024 and result["size"] > 3 * GB - 64


@pytest.mark.parametrize("kind", ["trainlog", "eval"])
def test_a_missing_file_is_exit_2(tmp_path: Path, kind: str) -> None:
    r = run_cli("check", kind, str(tmp_path / "absent"))
    assert r.returncode == 2 and "No such file" in r.stderr


@pytest.mark.slow
def test_check_trainlog_on_a_real_trainer_log_and_a_hidden_nan(tmp_path: Path) -> None:
    real = Path(__file__).parent / "data" / "trainer_v5_tiny.log"
    rc, result = check("trainlog", str(real))
    assert rc == 0 and len(result["points"]) == 12 and result["anomalies"] == []
    bad = tmp_path / "train.log"
    bad.write_text(real.read_text() + "".join(
        f"{{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-4, 'epoch': {i}}}\n" for i in range(3)))
    rc, result = check("trainlog", str(bad))
    assert rc == 1 and {"hidden_nan", "zero_loss_streak"} <= {a["code"] for a in result["anomalies"]}
    assert result["points"][-1]["grad_norm"] is None  # NaN is null in JSON, and an anomaly says so
    assert list(result) == ["points", "anomalies", "summary", "lines", "unparsed", "steps"]  # the JSON contract's order
    assert list(result["anomalies"][0]) == ["code", "severity", "step", "message"]


@pytest.mark.slow
def test_check_eval_finds_the_fake_zero(tmp_path: Path) -> None:
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": i, "prompt": "17*23=", "gold": "391", "pred": None, "correct": False,
                                         "finish_reason": "length", "content": "",
                                         "reasoning_content": "<think>17*23 is"}) + "\n" for i in range(10)))
    rc, result = check("eval", str(items))
    assert rc == 1 and "fake_zero" in {p["code"] for p in result["problems"]}
    assert list(result) == ["n", "correct", "accuracy", "pred_none", "truncated", "empty_content", "reasoning_only",
                            "think_leaks", "malformed", "malformed_lines", "format", "layout", "scored", "split",
                            "recoverable", "problems", "images", "over_cap",
                            "largest_over"]  # the JSON contract's order
    assert list(result["problems"][0]) == ["code", "severity", "message", "count"]
    text = run_cli("check", "eval", str(items)).stdout
    assert "fake_zero" in text and "--reasoning-format none" in text
