"""The console's themes and stylesheet. Panes style themselves with theme variables
($primary, $error, ...), so switching theme recolours everything, charts included."""

from __future__ import annotations

from pathlib import Path

from textual.theme import Theme

SAMAI_DARK = Theme(
    name="samai-dark",
    primary="#5fafff",
    secondary="#87d7af",
    accent="#ffaf5f",
    warning="#ffd75f",
    error="#ff5f5f",
    success="#5fd787",
    foreground="#d0d0d0",
    background="#121417",
    surface="#1b1e23",
    panel="#23272e",
    dark=True,
)

SAMAI_LIGHT = Theme(
    name="samai-light",
    primary="#005fd7",
    secondary="#00875f",
    accent="#af5f00",
    warning="#9a6700",
    error="#c11c1c",
    success="#1a7f37",
    foreground="#1f2328",
    background="#f6f8fa",
    surface="#ffffff",
    panel="#eaeef2",
    dark=False,
)

# For glare, bad terminals and tired eyes: pure black and white, saturated signals.
SAMAI_CONTRAST = Theme(
    name="samai-contrast",
    primary="#00ffff",
    secondary="#ffffff",
    accent="#ffff00",
    warning="#ffff00",
    error="#ff3030",
    success="#00ff00",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#1c1c1c",
    dark=True,
    luminosity_spread=0.3,
)

THEMES = (SAMAI_DARK, SAMAI_LIGHT, SAMAI_CONTRAST)
DEFAULT_THEME = SAMAI_DARK.name


def stylesheet() -> str:
    return Path(__file__).with_name("samai.tcss").read_text("utf-8")  # package data, as the pipelines are
