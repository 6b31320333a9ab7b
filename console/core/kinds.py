"""The kinds of change the console makes to the box. Each kind has one plan type in the action
layer (actions.PLANS) and, where an alert can offer it, one fix (fixes.FIXES). A kind is never a
free string: one that is not listed here cannot be planned or offered. Light on purpose: the TUI
imports it with its alerts, before the action layer."""

from __future__ import annotations

from enum import StrEnum


class ActionKind(StrEnum):
    FIRE = "fire"
    RESTART = "restart"
    RESUME = "resume"
    STOP = "stop"
    KILL = "kill"
    CLEAN = "clean"
    PRUNE = "prune"  # a training run's older checkpoints deleted (a clean of them)
    UNINSTALL = "uninstall"
    GGUF = "gguf"
