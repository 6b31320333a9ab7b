"""The footer: Textual's, composed once the keys are known and again only when they change."""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey


class KeysFooter(Footer):
    """Textual's Footer composes its keys only after the next refresh, so the first screen is
    painted without them, and builds them all anew on every refresh of the bindings (each
    focus move, each screen resume), at tens of milliseconds of style work each time. This
    one composes them as soon as the bindings are known, and again only when what it would
    show has changed."""

    _composed: tuple = ()  # what the keys on show were composed from

    def _shown(self) -> tuple:
        """Everything Footer.compose reads."""
        if not self._bindings_ready:
            return ()
        app = self.app
        keys = tuple((key, a.binding, a.enabled, a.tooltip, app.get_key_display(a.binding))
                     for key, a in self.screen.active_bindings.items())
        return (self.compact, self.show_command_palette, self.combine_groups, app.ENABLE_COMMAND_PALETTE, keys)

    def bindings_changed(self, screen: Screen) -> None:
        super().bindings_changed(screen)  # recomposes after the next refresh, which then finds nothing to do
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self.call_later(self.recompose)

    def compose(self):
        self._composed = self._shown()
        for widget in super().compose():
            if isinstance(widget, FooterKey) and not widget.has_class("-command-palette"):
                # A key starts compact, then its binding to the footer's `compact` switches it: styled twice.
                # (The command palette's key is not bound: it stays compact.)
                widget.set_reactive(FooterKey.compact, self.compact)
            yield widget

    async def recompose(self) -> None:
        if self.is_attached and self._shown() == self._composed:
            return
        await super().recompose()
