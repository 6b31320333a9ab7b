"""What the operator chose in the UI and expects to find next time (the theme)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from samai.console.core.paths import config_dir


def prefs_path() -> Path:
    return config_dir() / "prefs.json"


def load() -> dict:
    try:
        data = json.loads(prefs_path().read_text("utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # no prefs, or unreadable ones: the defaults will do


def save(**changes) -> None:
    path = prefs_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**load(), **changes}, indent=1), "utf-8")
    os.replace(tmp, path)
