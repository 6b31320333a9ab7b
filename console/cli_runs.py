"""`eval diff`: two eval runs of the box compared item by item (console/core/evaldiff.py), as text
or JSON (console/report.py writes the text: every text of the box's files through visible())."""

from __future__ import annotations

import argparse
import json

from samai.console.core import config as config_mod
from samai.console.core.evaldiff import EvalDiff, diff
from samai.console.core.evalruns import read_run_items, run_items_path
from samai.console.report import describe_diff
from samai.remote.boxapi import Box

EXIT_OK = 0


class RunMissing(Exception):
    """A run named on the command line whose items the box does not have."""


async def eval_command(args: argparse.Namespace, cfg: config_mod.Config, box: Box) -> int:
    result = await eval_diff(box, cfg, args.a, args.b)
    print(json.dumps(result.to_json(), indent=2) if args.json else describe_diff(result))
    return EXIT_OK


async def eval_diff(box: Box, cfg: config_mod.Config, a: str, b: str) -> EvalDiff:
    runs = []
    for run in (a, b):
        name, path = run_items_path(cfg.workspace, cfg.ui.eval_reports, run)
        items = await read_run_items(box, name, path)
        if items is None:
            raise RunMissing(f"eval run {run!r}: no {path} on the box")
        runs.append(items)
    return diff(*runs)
