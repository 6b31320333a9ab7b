"""GGUF surgery in the TUI (issue 19): `o` on a .gguf shows its header, KVs and tensors instead of
its bytes, `/` filters the tables, `e` sets a KV and `a` adds tensors through the action layer's
confirmation. The real app, the real box tool on this machine, real files: llama.cpp's own
ggml-vocab GGUFs and files written by gguf-py's GGUFWriter (hostile names), cut and garbage ones."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from textual.widgets import Button, DataTable, Input

from samai.console.app import SamaiApp
from samai.console.core import config
from samai.console.screens.dialogs import ConfirmDialog, PathDialog
from samai.console.screens.gguf import MAX_ROWS, GgufScreen
from samai.console.screens.gguf_dialogs import AddTensorsDialog, KvEdit, SetKvDialog, editable
from samai.remote.box.gguf_check import check_file
from samai.remote.model import GgufHeader, GgufKv, GgufProblem, GgufTensorInfo
from samai.remote.safe_text import visible
from tests.gguf_artifacts import llama_vocab_files
from tests.helpers import action_layer, collect_toasts, pilot_until
from tests.httpfiles import FileServer

SIZE = (160, 50)
MARKUP = r"[link=a:b]L[/x] [@click=app.quit]Q[/] [b B [$v] \[e]"
OSC = "\x1b]0;pwned\x07\x1b[2J"
HOSTILE_KEY = f"general.{MARKUP} {OSC}"
HOSTILE_VALUE = f"{MARKUP} value {OSC}"
HOSTILE_TENSOR = "[b]blk.0[/x]\x1b[2J.weight"  # GGML_MAX_NAME: at most 63 bytes


def _config(tmp_path: Path, ws: Path) -> config.Config:
    f = tmp_path / "gguf.toml"
    f.write_text(f'[target]\npoll_interval = 0.2\ntimeout = 30\npython = "{sys.executable}"\n'
                 f'[workspace]\npath = "{ws}"\n[stages.hello]\nkey = "h"\ncommand = "sleep 30"\n')
    return config.load(f)


def _vocab(name: str = "ggml-vocab-llama-spm.gguf") -> Path:
    return next(p for p in llama_vocab_files() if p.name == name)


def _hostile_model(path: Path) -> None:
    """A small real GGUF (gguf-py's writer) whose KV key, KV value and tensor name are hostile."""
    w = GGUFWriter(str(path), "llama")
    w.add_string(HOSTILE_KEY, HOSTILE_VALUE)
    w.add_uint32("hostile.count", 7)
    w.add_tensor(HOSTILE_TENSOR, np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("output.weight", np.ones((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _plain(widget) -> str:
    return str(widget.render())


def _rows(table: DataTable) -> list[str]:
    return [" | ".join(str(c) for c in table.get_row_at(r)) for r in range(table.row_count)]


def _assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, f"raw control characters reach the terminal: {text!r}"


async def _shown(pilot, kind: type, part: str):
    """The screen of that kind once it is on top and composed (its `part` is there)."""
    app = pilot.app
    return await pilot_until(pilot, lambda: isinstance(app.screen, kind) and app.screen.query(part) and app.screen,
                             timeout=60)


async def _open(pilot, path: str) -> GgufScreen:
    """`o`, the path typed into the dialog, Enter: the GGUF screen."""
    await pilot.press("o")
    dialog = await _shown(pilot, PathDialog, "Input")
    field = dialog.query_one(Input)
    field.value = path
    field.focus()
    await pilot.press("enter")
    return await _shown(pilot, GgufScreen, "#gguf-header")


async def _loaded(pilot, screen: GgufScreen) -> str:
    """The header panel once the box's answer (or its error) is shown."""
    return await pilot_until(pilot, lambda: "reading the header" not in (text := _plain(
        screen.query_one("#gguf-header"))) and text, timeout=60)


@pytest.mark.slow
async def test_o_on_a_real_gguf_shows_its_header_and_tables_and_escape_returns(tmp_path, workspace) -> None:
    shutil.copy(_vocab(), workspace / "vocab.gguf")
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await _open(pilot, "vocab.gguf")
        header = await _loaded(pilot, screen)
        reader = GGUFReader(str(workspace / "vocab.gguf"))
        size = (workspace / "vocab.gguf").stat().st_size
        version = int.from_bytes((workspace / "vocab.gguf").read_bytes()[4:8], "little")
        assert f"GGUF v{version} " in header
        assert f"tensors {len(reader.tensors)}" in header and f"size {size}" in header
        assert f"data_start {reader.data_offset}" in header and "no problem" in header
        kvs = screen.query_one("#gguf-kvs", DataTable)
        rows = _rows(kvs)
        assert any(r.startswith("general.architecture | str | llama") for r in rows), rows
        tokens = next(r for r in rows if r.startswith("tokenizer.ggml.tokens"))
        assert "arr[str]" in tokens and "32000 items" in tokens
        # `/` filters the focused table as it is typed; Escape clears the filter.
        kvs.focus()
        await pilot.press("slash", *"eos")
        await pilot_until(pilot, lambda: _rows(kvs) and all("eos" in r.split(" | ")[0] for r in _rows(kvs)))
        assert len(_rows(kvs)) < len(rows)
        await pilot.press("escape")
        await pilot_until(pilot, lambda: len(_rows(kvs)) == len(rows))
        # Enter keeps a filter; the first Escape in the table clears it, the next goes back.
        await pilot.press("slash", *"eos", "enter")
        await pilot_until(pilot, lambda: len(_rows(kvs)) < len(rows) and screen.focused is kvs)
        await pilot.press("escape")
        await pilot_until(pilot, lambda: len(_rows(kvs)) == len(rows))
        assert app.screen is screen
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, GgufScreen))
        assert app.is_running


@pytest.mark.slow
async def test_the_tensor_table_of_a_model(tmp_path, workspace) -> None:
    _hostile_model(workspace / "model.gguf")
    reader = GGUFReader(str(workspace / "model.gguf"))
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await _open(pilot, "model.gguf")
        await _loaded(pilot, screen)
        tensors = screen.query_one("#gguf-tensors", DataTable)
        rows = await pilot_until(pilot, lambda: _rows(tensors))
        last = reader.tensors[-1]
        offset = int(last.data_offset) - int(reader.data_offset)
        assert rows[-1] == f"output.weight | F32 | 32×4 | {offset} | 512 B", rows


@pytest.mark.slow
async def test_hostile_kv_and_tensor_names_are_shown_literally(tmp_path, workspace) -> None:
    _hostile_model(workspace / "model.gguf")
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await _open(pilot, "model.gguf")
        await _loaded(pilot, screen)
        kvs = "\n".join(_rows(screen.query_one("#gguf-kvs", DataTable)))
        tensors = "\n".join(_rows(screen.query_one("#gguf-tensors", DataTable)))
        assert visible(HOSTILE_KEY) in kvs and visible(HOSTILE_VALUE) in kvs
        assert visible(HOSTILE_TENSOR) in tensors
        _assert_inert(kvs + tensors)
        # The form for the hostile KV: its key and value literal, the value not put in the input raw.
        await _select_kv(pilot, screen, "pwned")  # the filter matches the key as it is, ESC and all
        await pilot.press("e")
        form = await _shown(pilot, SetKvDialog, "#out")
        text = "\n".join(_plain(w) for w in form.query("Static, Label"))
        assert visible(HOSTILE_KEY) in text and visible(HOSTILE_VALUE) in text
        _assert_inert(text)
        assert form.query_one("#value", Input).value == ""
        await pilot.press("escape")
        await pilot_until(pilot, lambda: app.screen is screen)
        # What the terminal gets: the painted lines hold the markup as typed, no escape sequence.
        for table_id, literal in (("#gguf-kvs", MARKUP[:20]), ("#gguf-tensors", "[b]blk.0[/x]␛[2J.weight")):
            table = screen.query_one(table_id, DataTable)
            painted = "\n".join(table.render_line(y).text for y in range(table.row_count + 2))
            assert literal in painted, painted
            _assert_inert(painted)
        await pilot.pause()  # until idle: every pending repaint of the hostile rows done
        assert app.is_running


@pytest.mark.slow
async def test_a_cut_file_shows_the_problem_and_garbage_never_crashes(tmp_path, workspace) -> None:
    data = _vocab().read_bytes()
    (workspace / "cut.gguf").write_bytes(data[:len(data) // 2])
    (workspace / "garbage.gguf").write_bytes(b"NOPE" + os.urandom(4092))
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await _open(pilot, "cut.gguf")
        header = await _loaded(pilot, screen)
        assert "header_truncated" in header, header
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, GgufScreen))
        screen = await _open(pilot, "garbage.gguf")
        header = await _loaded(pilot, screen)
        assert "bad_magic" in header, header
        _assert_inert(header)
        await pilot.press("escape")
        screen = await _open(pilot, "missing.gguf")
        missing = await _loaded(pilot, screen)
        assert "cannot read the header" in missing and "missing.gguf" in missing, missing
        await pilot.press("escape")
        await pilot_until(pilot, lambda: not isinstance(app.screen, GgufScreen))
        assert app.is_running


@pytest.mark.slow
async def test_a_huge_table_renders_a_bounded_number_of_rows(tmp_path, workspace) -> None:
    """A header of 150k KVs and tensors (the box bounds what it sends; the view caps what it renders)."""
    many = 150_000
    header = GgufHeader(path="big.gguf", file_size=1 << 34, version=3, tensor_count=many, kv_count=many,
                        kvs=tuple(GgufKv(f"k.{n}", "u32", str(n)) for n in range(many)),
                        tensors=tuple(GgufTensorInfo(f"blk.{n}.w", "F32", (32,), n * 128, 128) for n in range(many)))
    app = SamaiApp(_config(tmp_path, workspace), poll=False)
    async with app.run_test(size=SIZE) as pilot:
        screen = GgufScreen("big.gguf")
        await app.push_screen(screen)
        screen.show_header(header)
        kvs, tensors = screen.query_one("#gguf-kvs", DataTable), screen.query_one("#gguf-tensors", DataTable)
        assert kvs.row_count == MAX_ROWS and tensors.row_count == MAX_ROWS
        assert f"of {many} shown" in str(tensors.border_subtitle)
        kvs.focus()
        await pilot.press("slash", *"k.14999")
        await pilot_until(pilot, lambda: kvs.row_count == 11)  # k.14999 and k.149990 .. k.149999
        assert app.is_running


@pytest.mark.slow
async def test_readonly_greys_the_surgery_keys_and_says_why(tmp_path, workspace) -> None:
    shutil.copy(_vocab(), workspace / "vocab.gguf")
    app = SamaiApp(_config(tmp_path, workspace), readonly=True)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        toasts = collect_toasts(app)
        screen = await _open(pilot, "vocab.gguf")
        await _loaded(pilot, screen)
        screen.query_one("#gguf-kvs", DataTable).focus()
        await pilot.press("e")
        await pilot_until(pilot, lambda: any("read-only" in t for t in toasts))
        await pilot.press("a")
        await pilot_until(pilot, lambda: sum("read-only" in t for t in toasts) >= 2)
        assert app.screen is screen  # no form opened
        assert sorted(p.name for p in workspace.glob("*.gguf*")) == ["vocab.gguf"]


def _string_kv(path: Path, key: str) -> str:
    field = GGUFReader(str(path)).fields[key]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


async def _select_kv(pilot, screen: GgufScreen, key: str) -> DataTable:
    """Filter the KV table down to the one key holding `key`: its row is the one selected."""
    kvs = screen.query_one("#gguf-kvs", DataTable)
    kvs.focus()
    await pilot.press("slash", *key, "enter")
    await pilot_until(pilot, lambda: kvs.row_count == 1 and pilot.app.screen.focused is kvs)
    return kvs


async def _confirm(pilot, *, press: str = "confirm") -> str:
    """The action layer's confirmation: what it shows; then the button pressed, and the action done."""
    app = pilot.app
    dialog = await _shown(pilot, ConfirmDialog, "#cancel")
    cancel = dialog.query_one("#cancel", Button)
    await pilot_until(pilot, lambda: dialog.focused is cancel)  # Enter on an unread dialog does nothing
    shown = "\n".join(_plain(w) for w in dialog.query("Static, Label"))
    dialog.query_one(f"#{press}", Button).press()
    await pilot_until(pilot, lambda: not app.busy, timeout=120)
    return shown


@pytest.mark.slow
async def test_set_a_kv_through_the_dialog_writes_a_checked_copy(tmp_path, workspace) -> None:
    shutil.copy(_vocab(), workspace / "vocab.gguf")
    before = (workspace / "vocab.gguf").read_bytes()
    name = "[b]tuned[/x] spm"  # what the operator types is shown as typed too
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        toasts = collect_toasts(app)
        screen = await _open(pilot, "vocab.gguf")
        await _loaded(pilot, screen)
        await _select_kv(pilot, screen, "general.name")
        await pilot.press("e")
        form = await _shown(pilot, SetKvDialog, "#out")
        text = "\n".join(_plain(w) for w in form.query("Static, Label"))
        assert "type str" in text and _string_kv(workspace / "vocab.gguf", "general.name") in text
        assert form.query_one("#out", Input).value == "vocab-edited.gguf"
        form.query_one("#value", Input).value = name
        await pilot.press("enter")
        shown = await _confirm(pilot)
        assert "vocab-edited.gguf" in shown and "general.name=" in shown and name in shown
        assert "stays free" in shown  # the disk the output needs, against the budget
        await pilot_until(pilot, lambda: any(t.startswith("wrote vocab-edited.gguf") for t in toasts), timeout=60)
        assert app.screen is screen and app.is_running
    out = workspace / "vocab-edited.gguf"
    result = check_file(str(out))
    assert result["ok"], result["problems"]
    assert _string_kv(out, "general.name") == name
    assert (workspace / "vocab.gguf").read_bytes() == before  # the input is never written


@pytest.mark.slow
async def test_a_cancelled_confirmation_writes_nothing(tmp_path, workspace) -> None:
    shutil.copy(_vocab(), workspace / "vocab.gguf")
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await _open(pilot, "vocab.gguf")
        await _loaded(pilot, screen)
        await _select_kv(pilot, screen, "llama.context_length")
        await pilot.press("e")
        form = await _shown(pilot, SetKvDialog, "#out")
        assert "type u32" in "\n".join(_plain(w) for w in form.query("Static"))
        form.query_one("#value", Input).value = "8192"
        await pilot.press("enter")
        await _confirm(pilot, press="cancel")
        assert app.screen is screen
    assert sorted(p.name for p in workspace.glob("*.gguf*")) == ["vocab.gguf"]


def _model(path: Path, tensors: dict[str, np.ndarray]) -> None:
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.slow
@pytest.mark.parametrize("by_url", [False, True], ids=["donor-on-the-box", "donor-by-url"])
async def test_add_tensors_from_a_donor_through_the_dialog(tmp_path, workspace, by_url) -> None:
    _model(workspace / "base.gguf", {"token_embd.weight": np.ones((8, 32), dtype=np.float32)})
    grafted = np.arange(64, dtype=np.float32).reshape(2, 32)
    served = tmp_path / "served"
    served.mkdir()
    _model(served / "donor.gguf", {"other.weight": np.zeros((1, 32), dtype=np.float32), "output.weight": grafted})
    shutil.copy(served / "donor.gguf", workspace / "donor.gguf")
    app = SamaiApp(_config(tmp_path, workspace))
    with FileServer(served) as server:
        donor = server.url("donor.gguf") if by_url else "donor.gguf"
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            toasts = collect_toasts(app)
            screen = await _open(pilot, "base.gguf")
            await _loaded(pilot, screen)
            await pilot.press("a")
            form = await _shown(pilot, AddTensorsDialog, "#out")
            assert form.query_one("#out", Input).value == "base-added.gguf"
            await pilot.press("enter")  # nothing typed yet: the form says what is missing, stays open
            await pilot_until(pilot, lambda: "donor is needed" in _plain(form.query_one("#problem")))
            form.query_one("#donor", Input).value = donor
            form.query_one("#tensors", Input).value = "output.weight"
            form.query_one("#expect-tensors", Input).value = "2"
            form.query_one("#expect-last", Input).value = "output.weight"
            await pilot.press("enter")
            shown = await _confirm(pilot)
            assert f"donor {donor}" in shown and "tensors added: output.weight" in shown
            await pilot_until(pilot, lambda: any(t.startswith("wrote base-added.gguf") for t in toasts), timeout=60)
        if by_url:  # only the header and the tensor's bytes were fetched, by range
            gets = server.gets("donor.gguf")
            assert gets and all(rng is not None and status == 206 for rng, status in gets), gets
    out = workspace / "base-added.gguf"
    assert check_file(str(out), expect_tensors=2, expect_last="output.weight")["ok"]
    reader = GGUFReader(str(out))
    assert [t.name for t in reader.tensors] == ["token_embd.weight", "output.weight"]
    assert np.array_equal(np.asarray(reader.tensors[-1].data).reshape(2, 32), grafted)


@pytest.mark.slow
async def test_readonly_refuses_in_the_action_layer_too(tmp_path, workspace) -> None:
    """Whatever the keys let through, the action layer the app builds refuses read-only."""
    shutil.copy(_vocab(), workspace / "vocab.gguf")
    app = SamaiApp(_config(tmp_path, workspace), readonly=True)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await _open(pilot, "vocab.gguf")
        await _loaded(pilot, screen)
        outcome = await action_layer(app).gguf(KvEdit("vocab.gguf", "general.name", "x", "str", "out.gguf").request())
        assert (outcome.ok, outcome.status) == (False, "refused") and "read-only" in outcome.message
    assert sorted(p.name for p in workspace.glob("*.gguf*")) == ["vocab.gguf"]


async def test_odd_fields_in_a_reply_are_shown_as_text(tmp_path, workspace) -> None:
    """The reply's shape items are not typed one by one: markup there is shown, never parsed."""
    header = GgufHeader(path="odd.gguf", file_size=10, tensors=(GgufTensorInfo("t", "type 99", ("[/x]", 2), 0, None),),
                        kvs=(GgufKv("k", "[b]arr[/b]", "[/y]", 3),))
    app = SamaiApp(_config(tmp_path, workspace), poll=False)
    async with app.run_test(size=SIZE) as pilot:
        screen = GgufScreen("odd.gguf")
        await app.push_screen(screen)
        screen.show_header(header)
        await pilot.pause()
        tensors, kvs = screen.query_one("#gguf-tensors", DataTable), screen.query_one("#gguf-kvs", DataTable)
        assert "[/x]×2" in tensors.render_line(1).text and "type 99" in tensors.render_line(1).text
        assert "[b]arr[/b]" in kvs.render_line(1).text and "[/y]" in kvs.render_line(1).text
        assert app.is_running


@pytest.mark.slow
async def test_a_plan_the_box_refuses_says_why_in_the_confirmation(tmp_path, workspace) -> None:
    shutil.copy(_vocab(), workspace / "vocab.gguf")
    (workspace / "vocab-edited.gguf").write_bytes(b"mine")  # the default OUT exists: never written over
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await _open(pilot, "vocab.gguf")
        await _loaded(pilot, screen)
        await _select_kv(pilot, screen, "general.name")
        await pilot.press("e")
        form = await _shown(pilot, SetKvDialog, "#out")
        form.query_one("#value", Input).value = "x"
        await pilot.press("enter")
        shown = await _confirm(pilot, press="cancel")
        assert "the box refuses it" in shown and "exists already" in shown, shown
    assert (workspace / "vocab-edited.gguf").read_bytes() == b"mine"


def test_gguf_screen_snapshot(snap_compare, tmp_path, workspace) -> None:
    """The screen as the operator sees it: the figures, a problem, both tables, the keys."""
    header = GgufHeader(
        path="models/tiny-q8_0.gguf", file_size=1_102_000, version=3, tensor_count=3, kv_count=4, alignment=32,
        header_end=1_050, data_start=1_056, data_end=1_102_120,
        kvs=(GgufKv("general.architecture", "str", "llama"), GgufKv("general.name", "str", "[b]tiny[/b]"),
             GgufKv("llama.context_length", "u32", "256"),
             GgufKv("tokenizer.ggml.tokens", "arr[str]", "[32000 items of str] <unk>, <s>, </s> ...", 32000)),
        tensors=(GgufTensorInfo("token_embd.weight", "Q8_0", (256, 4096), 0, 1_114_112),
                 GgufTensorInfo("blk.0.attn_q.weight", "Q8_0", (256, 256), 1_114_112, 69_632),
                 GgufTensorInfo("output_norm.weight", "F32", (256,), 1_183_744, 1_024)),
        problems=(GgufProblem("truncated", "error", "The file is 1102000 bytes, 120 SHORT of data_start 1056"
                              " + end of tensor data 1101064 = 1102120 (truncated download or copy?)."),))

    async def run_before(pilot) -> None:
        screen = GgufScreen(header.path)
        await pilot.app.push_screen(screen)
        screen.show_header(header)
        await pilot.pause()

    app = SamaiApp(_config(tmp_path, workspace), poll=False)
    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


@pytest.mark.slow
async def test_a_real_model_s_tensor_table(tmp_path, workspace) -> None:
    """Gemma 3 270M Q4_K_M (a real quantized model, opened where it lies): every tensor listed,
    in the file's order, and its vocabulary of 262k tokens summed up in one row."""
    from tests.gguf_artifacts import gemma_q4_k_m

    path = gemma_q4_k_m()
    checked = check_file(str(path))
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        screen = await _open(pilot, str(path))
        header = await _loaded(pilot, screen)
        assert f"tensors {checked['tensor_count']} " in header and "no problem" in header
        tensors = screen.query_one("#gguf-tensors", DataTable)
        rows = await pilot_until(pilot, lambda: _rows(tensors))
        assert len(rows) == checked["tensor_count"]
        assert rows[0].startswith(f"{checked['first_tensor']} | ")
        assert rows[-1].startswith(f"{checked['last_tensor']} | ")
        kvs = _rows(screen.query_one("#gguf-kvs", DataTable))
        tokens = next(r for r in kvs if r.startswith("tokenizer.ggml.tokens"))
        assert "262144 items" in tokens


async def test_the_form_never_starts_from_a_value_the_box_cut(workspace, box) -> None:
    """A chat template runs to KBs and `gguf show` sends its start: editing that would write the cut
    value back, so the form starts empty; a short value starts as it is."""
    w = GGUFWriter(str(workspace / "t.gguf"), "llama")
    w.add_string("tokenizer.chat_template", "{% for m in messages %}" * 100)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    header = await box.gguf_show("t.gguf")
    kvs = {kv.key: kv for kv in header.kvs}
    template, name, tokens = kvs["tokenizer.chat_template"], kvs["general.name"], kvs["tokenizer.ggml.tokens"]
    assert len(template.value) < 2300 and not editable(template.type, template.value)
    assert editable(name.type, name.value) and not editable(tokens.type, tokens.value)


@pytest.mark.slow
async def test_o_on_a_gguf_screen_opens_another_file_where_it_is_seen(tmp_path, workspace) -> None:
    """A second .gguf stacks its screen (Esc returns to the first, loaded); a log goes back to the log pane."""
    shutil.copy(_vocab(), workspace / "a.gguf")
    _hostile_model(workspace / "b.gguf")
    (workspace / "notes.log").write_text("hello from the log\n")
    app = SamaiApp(_config(tmp_path, workspace))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        first = await _open(pilot, "a.gguf")
        second = await _open(pilot, "b.gguf")
        await _loaded(pilot, second)
        assert second is not first and "output.weight" in "\n".join(_rows(second.query_one("#gguf-tensors")))
        await pilot.press("escape")
        await pilot_until(pilot, lambda: app.screen is first)
        assert "no problem" in await _loaded(pilot, first)
        await pilot.press("o")
        dialog = await _shown(pilot, PathDialog, "Input")
        dialog.query_one(Input).value = "notes.log"
        await pilot.press("enter")
        await pilot_until(pilot, lambda: app.screen is app.box_screen)
        assert "notes.log" in str(app.box_screen.query_one("#log").border_title)
