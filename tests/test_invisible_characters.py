"""Bidi and invisible characters from the box are shown as stand-ins, as the control characters are.

A right-to-left override (U+202E) or an isolate (U+2066-2069) in a file name or a command line
reorders what the operator reads; a zero-width space (U+200B), joiner or byte-order mark makes two
different names look the same. Every place box text reaches the terminal goes through one rule
(remote/safe_text.py): the CLI's text output, the log pane, the GGUF view, the GPU pane."""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.screens.gguf import kv_cells, tensor_cells
from samai.remote.model import GgufKv, GgufTensorInfo, Gpu
from samai.remote.safe_text import visible
from samai.widgets.gpus import gpu_row
from samai.widgets.logview.buffer import clean_line
from tests.helpers import pilot_until

# Format characters of every kind: bidi embeddings, overrides and isolates, zero-width ones, the
# soft hyphen, the Arabic letter mark, the byte-order mark; a lone surrogate (bytes not UTF-8).
INVISIBLE = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200b\u200c\u200d\u200e\u200f\u2060\u00ad" \
            "\u061c\ufeff"
TRICK = "evil\u202egnp.py\u200b \u2066admin\u2069"
HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def hidden_in(text: str) -> list[str]:
    return sorted({c for c in text if c != "\t" and c != "\n" and unicodedata.category(c) in HIDDEN})


@given(text=st.text(st.characters(codec=None), max_size=60) | st.sampled_from([TRICK, INVISIBLE, "\udcff x"]))
def test_visible_leaves_no_hidden_character_and_keeps_every_place(text: str) -> None:
    shown = visible(text)
    assert not hidden_in(shown.replace("\t", "")), ascii(shown)
    assert len(shown) == len(text)  # one stand-in a character: cut to a width, a line stays in step
    assert all(a == b for a, b in zip(shown, text, strict=True) if unicodedata.category(b) not in HIDDEN)


def test_every_format_character_has_a_stand_in() -> None:
    assert visible(INVISIBLE) == "\ufffd" * len(INVISIBLE)
    assert visible(TRICK) == "evil\ufffdgnp.py\ufffd \ufffdadmin\ufffd"
    assert visible("printable, tabs\tand spaces\u00a0stay") == "printable, tabs\tand spaces\u00a0stay"


def test_the_tui_widgets_show_stand_ins() -> None:
    assert not hidden_in(clean_line(TRICK))  # the log pane's rows
    assert not hidden_in(gpu_row(Gpu(index=0, name=f"NVIDIA {TRICK}")).plain)  # the GPU pane
    kv = GgufKv(f"general.{TRICK}", "str", TRICK)
    tensor = GgufTensorInfo(f"blk.{TRICK}", "F32", (2,), 0, 8)
    for cell in (*kv_cells(kv), *tensor_cells(tensor)):  # the GGUF view's tables
        assert not hidden_in(str(cell)), ascii(str(cell))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "samai.console", *args], capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=60)


@pytest.mark.slow
def test_the_cli_shows_stand_ins_in_a_log_and_a_command_line(tmp_path: Path, workspace: Path, spawn) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n[stages.hello]\nkey = "h"\ncommand = "echo hi"\n')
    (workspace / "train.log").write_text(f"saved {TRICK}\n{INVISIBLE}\n")
    tail = cli("--config", str(cfg), "tail", "train.log")
    assert tail.returncode == 0, tail.stderr
    text = tail.stdout.decode("utf-8")
    assert not hidden_in(text) and "evil\ufffdgnp.py" in text
    listener = spawn(TRICK, "-c", "import time; print('up', flush=True); time.sleep(60)", executable=sys.executable,
                     stdout=subprocess.PIPE, text=True)
    assert listener.stdout.readline() == "up\n"
    snap = cli("--config", str(cfg), "snapshot")
    assert snap.returncode == 0, snap.stderr
    assert not hidden_in(snap.stdout.decode("utf-8"))


@pytest.mark.slow
async def test_the_log_pane_on_screen_shows_stand_ins(tmp_path: Path, workspace: Path) -> None:
    cfg = tmp_path / "c.toml"
    (workspace / "logs").mkdir()
    (workspace / "logs" / "hello.log").write_text(f"line {TRICK}\n")
    cfg.write_text(f'[workspace]\npath = "{workspace}"\n[stages.hello]\nkey = "h"\ncommand = "sleep 30"\n'
                   'log = "logs/hello.log"\n')
    app = SamaiApp(config.load(cfg))
    async with app.run_test(size=(150, 45)) as pilot:
        await pilot_until(pilot, lambda: "evil" in app.export_screenshot())
        screen = app.export_screenshot()
        assert "evil\ufffdgnp.py" in screen and not hidden_in(screen.replace("\n", ""))
