"""The footer: the keys the focused pane and the app answer now, one line, from public Textual
APIs (the screen's active bindings and its bindings-updated signal). It renders only when what
it shows changes: a focus move that keeps the same keys costs nothing."""

from __future__ import annotations

from dataclasses import replace

from textual.content import Content
from textual.dom import DOMNode
from textual.events import Click
from textual.widgets import Static


class KeysFooter(Static):
    DEFAULT_CSS = """
    KeysFooter { dock: bottom; height: 1; background: $footer-background; color: $footer-foreground; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.keys: tuple[tuple[str, str, str, bool], ...] = ()  # (key shown, description, action, enabled)
        self._spans: list[tuple[int, int, str, DOMNode]] = []  # (start, end, action, its node): what a click runs

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self.call_after_refresh(self._update)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, _screen: object) -> None:
        self._update()

    def _update(self) -> None:
        shown = self._shown_keys()
        keys = tuple(key for key, _ in shown)
        if keys == self.keys:
            return
        self.keys = keys
        parts: list = []
        self._spans, at = [], 0
        for (key, description, action, enabled), node in shown:
            style = "$footer-key-foreground bold" if enabled else "$footer-key-foreground 50%"
            parts += [(f" {key} ", style), (f"{description} ", "" if enabled else "$footer-foreground 50%")]
            width = len(key) + len(description) + 3
            self._spans.append((at, at + width, action, node))
            at += width
        self.update(Content.assemble(*parts))

    def _shown_keys(self) -> list[tuple[tuple[str, str, str, bool], DOMNode]]:
        seen: set[str] = set()
        keys = []
        for key, active in self.screen.active_bindings.items():
            binding = active.binding
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            shown = self.app.get_key_display(replace(binding, key=key))
            keys.append(((shown, binding.description, binding.action, active.enabled), active.node))
        # The focused pane's keys, then the console's, then the screen's (q and ? before a screen's many).
        return sorted(keys, key=lambda k: 2 if k[1] is self.screen else 1 if k[1] is self.app else 0)

    async def on_click(self, event: Click) -> None:
        """A click on a key does what the key does."""
        hit = next(((a, node) for start, end, a, node in self._spans if start <= event.x < end), None)
        if hit:
            await self.app.run_action(hit[0], hit[1])
