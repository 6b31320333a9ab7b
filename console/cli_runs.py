"""The commands that look back: `eval diff` (two eval runs item by item, console/core/evals/diff.py),
`timeline` (what happened on the box, in order, console/core/timeline.py) and `incident` (all of
it in one masked file, console/core/incident.py). As text or JSON (console/report.py writes the
text: every text of the box's files through visible())."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from samai.console.core import config as config_mod
from samai.console.core.evals.diff import EvalDiff, diff
from samai.console.core.evals.runs import NotReadWhole, read_run_items, run_items_path
from samai.console.core.timeline import read_timeline
from samai.console.report import describe_diff, describe_timeline
from samai.remote.boxapi import Box

EXIT_OK = 0


class RunMissing(Exception):
    """A run named on the command line whose items the box does not have, or could not give whole
    (a diff of a part is refused, never judged as if it were the whole)."""


async def eval_command(args: argparse.Namespace, cfg: config_mod.Config, box: Box) -> int:
    result = await eval_diff(box, cfg, args.a, args.b)
    print(json.dumps(result.to_json(), indent=2) if args.json else describe_diff(result))
    return EXIT_OK


async def eval_diff(box: Box, cfg: config_mod.Config, a: str, b: str) -> EvalDiff:
    runs = []
    for run in (a, b):
        name, path = run_items_path(cfg.workspace, cfg.ui.eval_reports, run)
        try:
            items = await read_run_items(box, name, path)
        except NotReadWhole as e:
            raise RunMissing(f"eval run {run!r}: {e}") from None
        if items is None:
            raise RunMissing(f"eval run {run!r}: no {path} on the box")
        runs.append(items)
    return diff(*runs)


async def timeline_command(args: argparse.Namespace, cfg: config_mod.Config, box: Box, since: float | None) -> int:
    from samai.console.core import paths

    events = await read_timeline(box, cfg, paths.audit_log(), since=since)
    print(json.dumps({"events": [e.to_json() for e in events]}, indent=2) if args.json else describe_timeline(events))
    return EXIT_OK


def since_seconds(text: str) -> float:
    """--since: 90s, 45m, 2h, 3d (a bare number is seconds)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as 90s, 45m, 2h or 3d") from None
    if not 0 < seconds < 10 * 365 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as 90s, 45m, 2h or 3d")
    return seconds


async def incident_command(args: argparse.Namespace, cfg: config_mod.Config, box: Box, since: float | None) -> int:
    from samai.console.core import paths
    from samai.console.core.detectors import detect
    from samai.console.core.incident import make_bundle, write_bundle

    snap = await box.snapshot(artifacts=[(a.name, a.path) for a in cfg.artifacts])
    findings = [f.to_json() for f in detect(cfg, snap)]
    content = await make_bundle(box, cfg, paths.audit_log(), since=since, findings=findings)
    size = write_bundle(content, Path(args.out))
    print(f"wrote {args.out}: {size:,} bytes, {len(content['timeline'])} events, {len(content['logs'])} logs "
          f"(secrets masked); open it anywhere with: samai-console replay {args.out}")
    return EXIT_OK
