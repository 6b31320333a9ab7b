"""A GGUF file as its header describes it: the figures of its layout, the checker's problems, its
KVs and its tensors, each a table that `/` filters as you type. It renders what the app hands it
(`show_header`, `show_error`) and asks the app for surgery with messages; it does no I/O.

Everything in it came from the box: keys, values and tensor names are shown as literal text with
control characters as stand-ins, values are cut, and each table renders at most MAX_ROWS rows (a
vocabulary KV or a model of many thousand tensors never stalls the screen; filter to see more)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static

from samai.console.core import units
from samai.remote.safe_text import visible
from samai.widgets.keys import bindings
from samai.widgets.pane import inert

if TYPE_CHECKING:
    from samai.remote.model import GgufHeader, GgufKv, GgufTensorInfo

MAX_ROWS = 1000  # rendered per table; the rest are counted and reachable by filtering
MAX_CELL = 160  # characters of a value or a name shown in a cell
KEYS_HINT = "Esc back (first clears a filter) · Tab next table · / filter · e set the KV · a add tensors"


def cut(text: str, limit: int = MAX_CELL) -> str:
    """Box text made visible and short enough for one cell."""
    text = visible(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


def cell(text: str, style: str = "") -> Text:
    return Text(cut(text), style=style, no_wrap=True, end="")


@dataclass(frozen=True)
class Table:
    """How one table shows the items of a header: what `/` matches in an item, and its cells (made
    only for the rows rendered: a header may hold a hundred thousand items)."""

    items: Sequence[Any]
    haystack: Callable[[Any], str]
    cells: Callable[[Any], tuple[Text | str, ...]]

    def matching(self, needle: str) -> list[int]:
        needle = needle.casefold()
        return [n for n, item in enumerate(self.items) if needle in self.haystack(item).casefold()]


def kv_cells(kv: GgufKv) -> tuple[Text | str, ...]:
    return cell(kv.key), cell(kv.type), cell(str(kv.value))  # an array's value says its count


def tensor_cells(t: GgufTensorInfo) -> tuple[Text | str, ...]:
    shape = "×".join(str(d) for d in t.shape)  # the box's reply is not typed item by item: text, never markup
    size = "?" if t.size is None else units.size(t.size)
    return cell(t.name), cell(t.type), cell(shape), cell(str(t.offset)), cell(size)


def tables(header: GgufHeader | None) -> dict[str, Table]:
    return {"gguf-kvs": Table(header.kvs if header else (), lambda kv: kv.key, kv_cells),
            "gguf-tensors": Table(header.tensors if header else (), lambda t: f"{t.name} {t.type}", tensor_cells)}


def _known(value: Any) -> str:
    return "?" if value is None else str(value)


def header_content(header: GgufHeader) -> Content:
    """The layout's figures, then every problem the checker found (or that it found none)."""
    parts: list[str | tuple[str, str]] = [("GGUF v", "$text-muted"), (_known(header.version), "bold")]
    for name, value in (("tensors", header.tensor_count), ("KVs", header.kv_count), ("alignment", header.alignment),
                        ("header_end", header.header_end), ("data_start", header.data_start),
                        ("data_end", header.data_end), ("size", header.file_size)):
        parts += ["  ", (f"{name} ", "$text-muted"), (_known(value), "bold")]
    lines = [Content.assemble(*parts)]
    for p in header.problems:
        lines.append(Content.assemble(("✗ ", "$error bold"), (p.code, "$error"), " ", visible(p.message)))
    if not header.problems:
        lines.append(Content.assemble(("✓ ", "$success"), "the checker finds no problem"))
    return Content("\n").join(lines)


class FilterInput(Input):
    """`/`: the focused table's filter, applied as it is typed; Esc clears it, Enter keeps it."""

    BINDINGS = bindings("gguf-filter")

    class Cancelled(Message):
        pass

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled())


class GgufScreen(Screen[None]):
    """One GGUF's header, KVs and tensors. `e` asks to set the selected KV, `a` to add tensors."""

    DEFAULT_CSS = """
    GgufScreen { layout: vertical; }
    GgufScreen #gguf-title { text-style: bold; color: $primary; height: 1; }
    GgufScreen #gguf-header { height: auto; max-height: 12; overflow-y: auto; padding: 0 1;
                              border: round $foreground 25%; }
    GgufScreen DataTable { height: 1fr; border: round $foreground 25%; border-title-color: $primary;
                           border-subtitle-color: $text-muted; }
    GgufScreen DataTable:focus { border: round $primary; }
    GgufScreen #gguf-tensors { height: 2fr; }
    GgufScreen FilterInput { dock: bottom; display: none; }
    GgufScreen FilterInput.-open { display: block; }
    GgufScreen #gguf-keys { dock: bottom; height: 1; color: $text-muted; }
    """
    BINDINGS = bindings("gguf")

    class EditRequested(Message):
        """`e` on a KV row: the app opens the form and runs the action."""

        def __init__(self, view: GgufScreen, kv: GgufKv) -> None:
            super().__init__()
            self.view, self.kv = view, kv

    class AddRequested(Message):
        """`a`: the app opens the form (the donor and its tensors) and runs the action."""

        def __init__(self, view: GgufScreen) -> None:
            super().__init__()
            self.view = view

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        super().__init__()
        self.path, self.readonly = path, readonly
        self.header: GgufHeader | None = None
        self._tables = tables(None)
        self._filters: dict[str, str] = {"gguf-kvs": "", "gguf-tensors": ""}
        self._filtering = "gguf-kvs"  # the table the open filter prompt applies to

    def compose(self) -> ComposeResult:
        yield Static(inert(f"gguf · {self.path}"), id="gguf-title")
        yield Static(Content("reading the header…"), id="gguf-header")
        with Vertical():
            kvs: DataTable[Text | str] = DataTable(id="gguf-kvs", cursor_type="row")
            kvs.add_columns("key", "type", "value")
            yield kvs
            tensors: DataTable[Text | str] = DataTable(id="gguf-tensors", cursor_type="row")
            tensors.add_columns("tensor", "type", "shape", "offset", "size")
            yield tensors
        yield FilterInput(placeholder="filter: a part of the key or the name; Enter keeps, Esc clears")
        readonly = " (read-only: e and a are off)" if self.readonly else ""
        yield Static(Content(KEYS_HINT + readonly), id="gguf-keys")

    def on_mount(self) -> None:
        self._title_tables()
        self.query_one("#gguf-kvs", DataTable).focus()

    # ------------------------------------------------------------ what the app hands it

    def show_header(self, header: GgufHeader) -> None:
        self.header = header
        self.query_one("#gguf-header", Static).update(header_content(header))
        self._tables = tables(header)
        for table_id in self._tables:
            self._fill(table_id)
        self.refresh_bindings()  # e and a work once there is a header

    def show_error(self, error: str) -> None:
        """The header could not be read: say why; the screen stays (Esc goes back)."""
        self.query_one("#gguf-header", Static).update(
            Content.assemble(("✗ ", "$error bold"), ("cannot read the header: ", "$error"), visible(error)))

    # ------------------------------------------------------------ tables and their filters

    def _fill(self, table_id: str) -> None:
        table = self.query_one(f"#{table_id}", DataTable)
        shown = self._tables[table_id]
        matching = shown.matching(self._filters[table_id])
        table.clear()
        for n in matching[:MAX_ROWS]:  # the key is the item's index in the header
            table.add_row(*shown.cells(shown.items[n]), key=str(n))
        self._title_tables()
        if len(matching) > MAX_ROWS:
            table.border_subtitle = Content(f"first {MAX_ROWS} of {len(matching)} shown: / narrows")

    def _title_tables(self) -> None:
        left_out = {"gguf-kvs": self.header.kvs_left_out if self.header else 0,
                    "gguf-tensors": self.header.tensors_left_out if self.header else 0}
        for table_id, name in (("gguf-kvs", "KVs"), ("gguf-tensors", "tensors")):
            table = self.query_one(f"#{table_id}", DataTable)
            items, needle = self._tables[table_id].items, self._filters[table_id]
            shown = f"{name} ({len(items)})" if not needle else f"{name} matching {cut(needle, 40)!r}"
            if left_out[table_id]:
                shown += f" · {left_out[table_id]} more in the file, not sent by the box"
            table.border_title = inert(shown)
            table.border_subtitle = None

    def action_open_filter(self) -> None:
        focused = self.focused
        self._filtering = focused.id if isinstance(focused, DataTable) and focused.id else self._filtering
        prompt = self.query_one(FilterInput)
        prompt.value = self._filters[self._filtering]
        prompt.add_class("-open")
        prompt.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if isinstance(event.input, FilterInput) and event.input.has_class("-open"):
            self._filters[self._filtering] = event.value
            self._fill(self._filtering)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if isinstance(event.input, FilterInput):
            self._close_filter()

    def on_filter_input_cancelled(self, _event: FilterInput.Cancelled) -> None:
        self._filters[self._filtering] = ""
        self._fill(self._filtering)
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one(FilterInput).remove_class("-open")
        self.query_one(f"#{self._filtering}", DataTable).focus()

    # ------------------------------------------------------------ surgery, asked of the app

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only: the surgery keys are shown greyed and do nothing (the app says why)."""
        if action in ("gguf_edit", "gguf_add"):
            return None if self.readonly or self.header is None else True
        return True

    def selected_kv(self) -> GgufKv | None:
        return self._selected("gguf-kvs", self.header.kvs if self.header else ())

    def action_gguf_edit(self) -> None:
        kv = self.selected_kv()
        if kv is None:
            self.notify("select a KV first (Tab moves between the tables)", severity="information", markup=False)
            return
        self.post_message(self.EditRequested(self, kv))

    def action_gguf_add(self) -> None:
        self.post_message(self.AddRequested(self))

    def _selected(self, table_id: str, items: Sequence[Any]) -> Any:
        table = self.query_one(f"#{table_id}", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return items[int(key)] if key is not None and key.isdigit() and int(key) < len(items) else None

    def action_close(self) -> None:
        """Esc: first the focused table's filter goes (as in k9s), then the screen."""
        focused = self.focused
        if isinstance(focused, DataTable) and focused.id and self._filters.get(focused.id):
            self._filters[focused.id] = ""
            self._fill(focused.id)
            return
        self.dismiss(None)

