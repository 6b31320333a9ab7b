"""Where the console keeps its own files on this machine (XDG base directories)."""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(variable: str, fallback: str) -> Path:
    value = os.environ.get(variable, "")
    base = Path(value) if os.path.isabs(value) else Path.home() / fallback
    return base / "samai"


def data_dir() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share")


def state_dir() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state")


def workspaces_dir() -> Path:
    """Where the default workspaces live: the one part of the data dir a workspace may be in."""
    return data_dir() / "workspaces"


def default_workspace(pipeline: str) -> Path:
    """The embedded default workspace: a local folder per pipeline under the user's data dir."""
    return workspaces_dir() / pipeline


def audit_log() -> Path:
    return state_dir() / "audit.jsonl"


def warnings_log() -> Path:
    """Where the libraries' warnings go (console/warnings_log.py), never to stderr."""
    return state_dir() / "warnings.log"


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config")


def saved_logs_dir() -> Path:
    return state_dir() / "saved-logs"


def own_dirs() -> tuple[Path, ...]:
    """The console's own folders on this machine: no workspace may hold them or lie in them
    (a workspace's clean would delete them), save a workspace inside workspaces_dir()."""
    return data_dir(), state_dir(), config_dir()
