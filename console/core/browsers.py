"""The stages that drive a headless Chromium (cu_eval, rft), the browsers the box is asked
about for them, and the finding when it has none: said before such a stage is fired, not by
its first episode."""

from __future__ import annotations

import re

from samai.console.core.config import Config, Stage, command_words
from samai.console.core.problems import Finding
from samai.remote.box.stages.chromium import BROWSERS, INSTALL_HINT
from samai.remote.model import Snapshot

BROWSER_STAGE = re.compile(r"(^|[\s/.])stages\.(cu_eval|rft)(\s|$)")


def browser_stages(cfg: Config) -> list[Stage]:
    return [s for s in cfg.stages if BROWSER_STAGE.search(s.command)]


def candidates(stage: Stage) -> tuple[str, ...]:
    """The browser the stage's command names (--browser PATH), else the ones it looks for."""
    words = command_words(stage.command) or tuple(stage.command.split())
    for i, word in enumerate(words):
        if word == "--browser" and i + 1 < len(words):
            return (words[i + 1],)
        if word.startswith("--browser="):
            return (word.split("=", 1)[1],)
    return BROWSERS


def browser_names(cfg: Config) -> list[str]:
    """Every browser the box is asked about (each poll's `binaries`), in the order looked for."""
    names: list[str] = []
    for stage in browser_stages(cfg):
        names.extend(n for n in candidates(stage) if n not in names)
    return names


def browser_missing(cfg: Config, snap: Snapshot, stages: list[Stage] | None = None) -> list[Finding]:
    """One finding for the stages (all that drive a browser, unless named) whose browser the box
    does not have; nothing where the snapshot did not ask."""
    seen = {b.path: b.executable for b in snap.binaries}
    lacking = [s.name for s in (browser_stages(cfg) if stages is None else stages)
               if any(n in seen for n in candidates(s)) and not any(seen.get(n) for n in candidates(s))]
    if not lacking:
        return []
    return [Finding("browser_missing", "error", f"no headless Chromium on the box for {', '.join(lacking)} "
                    f"(looked for {', '.join(browser_names(cfg))}): {INSTALL_HINT}")]
