"""The forms of GGUF surgery: set one KV, add tensors from a donor. They only collect what the
operator typed; the plan built from it (what is written where, the disk it needs) is shown and
confirmed by the action layer's own dialog, which is where readonly and the disk budget refuse."""

from __future__ import annotations

import posixpath
import re
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, TypeVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from samai.console.screens.dialogs import DIALOG_CSS
from samai.remote.safe_text import visible
from samai.widgets.pane import inert

SHOWN_VALUE = 400  # characters of a KV's current value in the form (a chat template runs to KBs)
CUT_BY_THE_BOX = re.compile(r"\.\.\. \(\d+ bytes\)$")  # how `gguf show` ends a string it cut (value_text)

FormT = TypeVar("FormT")
FORM_CSS = """
{name} Input {{ margin-bottom: 1; }}
{name} .field {{ color: $text-muted; }}
{name} #problem {{ color: $error; }}
"""


@dataclass(frozen=True)
class KvEdit:
    """Set one KV of `path`, written as a new file `out`."""

    path: str
    key: str
    value: str  # as typed: the type (kept from the existing KV) says how it is read
    value_type: str
    out: str

    def request(self) -> dict[str, Any]:
        """The box tool's set_kv request (the type of an existing key is kept by the box)."""
        return {"op": "set_kv", "path": self.path, "out": self.out, "set": {self.key: self.value}}


@dataclass(frozen=True)
class TensorAdd:
    """Add the named tensors of `donor` (a path on the box or an http(s) URL) to `path`, as `out`."""

    path: str
    donor: str
    tensors: tuple[str, ...]
    out: str
    expect_tensors: int | None = None
    expect_last: str | None = None

    def request(self) -> dict[str, Any]:
        """The box tool's add_tensors request."""
        request: dict[str, Any] = {"op": "add_tensors", "path": self.path, "donor": self.donor,
                                   "tensors": list(self.tensors), "out": self.out}
        if self.expect_tensors is not None:
            request["expect_tensors"] = self.expect_tensors
        if self.expect_last is not None:
            request["expect_last"] = self.expect_last
        return request


def beside(path: str, suffix: str) -> str:
    """NAME-suffix.gguf in the folder of path: the input is never written over."""
    folder, name = posixpath.split(path)
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    return posixpath.join(folder, f"{stem}-{suffix}.gguf")


def split_names(text: str) -> tuple[str, ...]:
    """Tensor names as typed: separated by spaces or commas (real names hold neither)."""
    return tuple(n for n in text.replace(",", " ").split() if n)


def editable(value_type: str, value: str) -> bool:
    """Whether the value as shown is the whole value, safe to start the new one from: not an
    array's summary, not a string the box cut, no control characters (the input would show them raw)."""
    return not value_type.startswith("arr") and not CUT_BY_THE_BOX.search(value) and value == visible(value)


def _field(label: str) -> Static:
    return Static(inert(label), classes="field")  # a label may name a type the box sent


def _buttons(action: str) -> Horizontal:
    return Horizontal(Button("Cancel", id="cancel", variant="primary"), Button(action, id="plan", variant="warning"))


class _Form(ModalScreen[FormT | None]):
    """A form's common keys: Enter or "Plan…" submits what was typed, Escape or Cancel drops it."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "plan":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    @abstractmethod
    def _submit(self) -> None: ...


class SetKvDialog(_Form[KvEdit]):
    """A KV's key, type and current value, the new value and where the edited copy goes."""

    DEFAULT_CSS = DIALOG_CSS.format(name="SetKvDialog") + FORM_CSS.format(name="SetKvDialog")

    def __init__(self, path: str, key: str, value_type: str, value: str) -> None:
        super().__init__()
        self.path, self.key, self.value_type, self.value = path, key, value_type, value

    def compose(self) -> ComposeResult:
        shown = self.value if len(self.value) <= SHOWN_VALUE else self.value[:SHOWN_VALUE] + "…"
        with Vertical():
            yield Label(inert(f"set {self.key} in {self.path}"), classes="title")
            yield _field(f"type {self.value_type} (kept) · now:")
            yield Static(inert(shown), classes="command")
            array = self.value_type.startswith("arr")
            yield _field("new value, as a JSON list" if array else "new value")
            start = self.value if editable(self.value_type, self.value) else ""
            yield Input(value=start, placeholder='["a", "b"]' if array else "", id="value")
            yield _field("write to (a new file; the input is never changed)")
            yield Input(value=beside(self.path, "edited"), id="out")
            yield Static(id="problem")
            yield _buttons("Plan…")

    def on_mount(self) -> None:
        self.query_one("#value", Input).focus()


    def _submit(self) -> None:
        out = self.query_one("#out", Input).value.strip()
        if not out:
            self.query_one("#problem", Static).update(Content("an output path is needed"))
            return
        self.dismiss(KvEdit(self.path, self.key, self.query_one("#value", Input).value, self.value_type, out))



class AddTensorsDialog(_Form[TensorAdd]):
    """The donor, the tensors to take from it, the output, and what the result must hold."""

    DEFAULT_CSS = DIALOG_CSS.format(name="AddTensorsDialog") + FORM_CSS.format(name="AddTensorsDialog")

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(inert(f"add tensors to {self.path}"), classes="title")
            yield _field("donor: a GGUF on the box or an http(s):// URL (only its header and the tensors are read)")
            yield Input(placeholder="models/donor.gguf or https://host/model.gguf", id="donor")
            yield _field("tensor names (spaces or commas between them)")
            yield Input(placeholder="blk.0.attn_q.weight output.weight", id="tensors")
            yield _field("write to (a new file; the input is never changed)")
            yield Input(value=beside(self.path, "added"), id="out")
            yield _field("the result must hold this many tensors (empty: the input's plus the added)")
            yield Input(id="expect-tensors", type="integer")
            yield _field("and end with this tensor (empty: not checked)")
            yield Input(id="expect-last")
            yield Static(id="problem")
            yield _buttons("Plan…")

    def on_mount(self) -> None:
        self.query_one("#donor", Input).focus()


    def _submit(self) -> None:
        form = self.form()
        if isinstance(form, str):
            self.query_one("#problem", Static).update(Content(form))
            return
        self.dismiss(form)

    def form(self) -> TensorAdd | str:
        """What was typed, or what is missing from it."""
        text = {i.id: i.value.strip() for i in self.query(Input)}
        names = split_names(text["tensors"])
        if not text["donor"]:
            return "a donor is needed"
        if not names:
            return "name at least one tensor"
        if not text["out"]:
            return "an output path is needed"
        count = text["expect-tensors"]
        if count and not count.isdigit():
            return "the expected tensor count is a whole number"
        return TensorAdd(self.path, text["donor"], names, text["out"], int(count) if count else None,
                         text["expect-last"] or None)
