"""The commands that read or act on a box (snapshot, doctor, check, fire, tail, gguf, ...): what
`samai-console COMMAND` runs once console/cli.py has parsed it. Apart from the parser so that
the TUI, which needs none of this, does not load it (nor the Box) before its first paint."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from samai.console.cli_common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, UsageError, fail
from samai.console.core import config as config_mod
from samai.console.core.connect import open_box
from samai.console.core.redact import redact
from samai.console.report import describe_check, describe_plan, describe_snapshot
from samai.remote.boxapi import Box, BoxError
from samai.remote.follow import CATCH_UP_READ, LogFollower
from samai.remote.model import Snapshot
from samai.remote.safe_text import visible
from samai.remote.transport import TransportError

if TYPE_CHECKING:
    from samai.console.core.actions import ActionOutcome, ActionPlan, Actions
    from samai.console.core.problems import CheckResult

FOLLOW_POLL_S = 0.5


def _json(value) -> str:
    """Exact and pure ASCII: ensure_ascii escapes C0, C1, U+2028/9 and all other non-ASCII as \\uXXXX."""
    return json.dumps(value, ensure_ascii=True, default=_json_bytes)


async def run(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    box = open_box(cfg, readonly=args.readonly)
    try:
        handlers = {"snapshot": _snapshot, "budget": _budget, "doctor": _doctor, "check": _check, "fire": _fire,
                    "stop": _stop, "kill": _kill, "tail": _tail, "gguf": _gguf, "eval": _eval,
                    "timeline": _timeline, "incident": _incident}
        handler = handlers[args.command]
        return await handler(args, cfg, box)
    except config_mod.UnknownStage as e:
        return fail(str(e), EXIT_USAGE)
    finally:
        await box.close()


# ------------------------------------------------------------------ reads


async def _snapshot(args, cfg, box: Box) -> int:
    snap = await box.snapshot(artifacts=[(a.name, a.path) for a in cfg.artifacts], serving=_serving_ports(cfg))
    print(_json(_snapshot_json(snap, cfg)) if args.json else _snapshot_text(snap, cfg))
    return EXIT_OK


def _serving_ports(cfg: config_mod.Config) -> list[int]:
    """Every port a serve-role stage declares: asked in one look, read for the stages that run."""
    from samai.console.core.serving.watch import ServingWatch

    return sorted(ServingWatch(cfg).serving_ports(s.name for s in cfg.stages))


def _snapshot_json(snap: Snapshot, cfg: config_mod.Config | None = None) -> dict:
    from samai.console.core.death import cause_of_death, death_json
    from samai.console.core.gpus.findings import gpu_findings  # see _budget

    # what the GPUs show (the reading itself is the snapshot's "gpus")
    found = [f.to_json() for f in gpu_findings(snap)]
    out = dict(asdict(snap), gpu_findings=found)
    out["serving"] = _serving_json(snap, cfg) if cfg is not None else []  # the figures, not the servers' raw text
    # each ended run's cause as the console judges it (absent for rc=0 and for a run still alive)
    out["states"] = [_with_death(raw, death_json(cause_of_death(rec, snap))) for raw, rec in
                     zip(out["states"], snap.states, strict=True)]
    return out


def _serving_json(snap: Snapshot, cfg: config_mod.Config) -> list[dict]:
    from samai.console.core.serving.watch import ServingWatch

    watch = ServingWatch(cfg, one_look=True)
    watch.observe(snap)
    return [v.to_json() for v in watch.views.values()]


def _with_death(raw: dict, death: dict | None) -> dict:
    raw = {k: v for k, v in raw.items() if k != "death"}
    return raw if death is None else dict(raw, death=death)


def _snapshot_text(snap: Snapshot, cfg: config_mod.Config) -> str:
    from samai.console.gpu_report import describe_gpus  # see _budget

    return describe_snapshot(snap, cfg) + "\n" + describe_gpus(snap.gpus, snap)


async def snapshot_all(args, cfg: config_mod.Config) -> int:
    """`snapshot --all-boxes`: every box at once, each on its own connection and deadline; exit 0
    when all answered, 1 when some did not (named on stderr), 2 when none did."""
    from samai.console.core.fleet import fleet_configs, gather_boxes

    if args.command != "snapshot" or args.box or args.target:
        raise UsageError("--all-boxes is for snapshot alone, without --box or --target: it reads every box "
                         "the config declares")

    async def fetch(box_cfg: config_mod.Config) -> Snapshot:
        box = open_box(box_cfg, readonly=True)
        try:
            return await box.snapshot(artifacts=[(a.name, a.path) for a in box_cfg.artifacts],
                                      serving=_serving_ports(box_cfg))
        finally:
            await box.close()

    configs = fleet_configs(cfg)
    found = await gather_boxes(configs, fetch)
    if args.json:
        configs_by_name = dict(configs)
        print(_json({"boxes": {name: _snapshot_json(got, configs_by_name[name]) if isinstance(got, Snapshot)
                               else got for name, got in found.items()}}))
    else:
        for name, box_cfg in configs:
            got = found[name]
            print(f"== {name} ({visible(redact(box_cfg.target.url))})")
            said = _snapshot_text(got, box_cfg) if isinstance(got, Snapshot) else f"unreachable: {got['error']}"
            print(visible(said) if not isinstance(got, Snapshot) else said)
    down = [name for name, got in found.items() if not isinstance(got, Snapshot)]
    if down:
        fail(f"{len(down)} of {len(found)} boxes did not answer: {', '.join(down)}", EXIT_PROBLEM)
    return EXIT_OK if not down else EXIT_USAGE if len(down) == len(found) else EXIT_PROBLEM


async def _budget(args, cfg, box: Box) -> int:
    snap = await box.snapshot(artifacts=[(a.name, a.path) for a in cfg.artifacts], processes=False)
    from samai.console.core.disk.budget import disk_budget, plan_run  # each command imports what it uses

    now = disk_budget(cfg, snap)
    peaks = plan_run(cfg, now.capacity)
    if args.json:
        print(_json({"capacity": now.capacity, "used": now.used, "free": now.free,
                     "reclaimable": now.reclaimable, "artifacts": [asdict(a) for a in now.artifacts],
                     "stages": [dict(asdict(p), fits=p.fits, kept_fits=p.kept_fits) for p in peaks]}))
    else:
        print(describe_plan(now, peaks))
    return EXIT_OK if all(p.fits for p in peaks) else EXIT_PROBLEM


async def _doctor(args, cfg, box: Box) -> int:
    """One look at the box through the same session as the TUI's and the watcher's (its poll, then
    every read beside it that is due), judged by the same detectors. With no history, the GPU watch
    sees this snapshot as its first reading: what one reading shows, and no stall."""
    from samai.console.core.feeds import Surroundings
    from samai.console.core.session import BoxSession, PollFailed

    session = BoxSession(cfg, lambda _: box, headless=True, around=Surroundings(one_look=True))
    looked = await session.look_once()
    if isinstance(looked, PollFailed):
        raise looked.exception if not looked.bug else BoxError(looked.error)
    for what, error in session.read_errors.items():  # the rest of the box is still worth its report
        print(f"samai-console: {visible(what)} was not read: {visible(error)}", file=sys.stderr)
    from samai.console.gpu_report import describe_gpus

    snap = looked.snapshot
    deaths = _deaths(cfg, snap)
    findings = doctor_findings(session, {d["stage"]: d["cause"] for d in deaths})
    if args.json:
        print(_json({"findings": [f.to_json() for f in findings], "gpus": asdict(snap.gpus), "deaths": deaths}))
    else:
        print(describe_gpus(snap.gpus, snap))
        for d in deaths:  # the box's words: plain text, control characters as stand-ins
            print(visible(f"died    {d['stage']} (rc={d['rc']}): {d['cause']}: {d['detail']}"))
        for f in findings:  # a finding quotes box text: file names, command lines
            print(visible(f"{f.severity:<7} {f.code}: {f.message}" + (f"  [fix: {f.action}]" if f.action else "")))
        if not findings:
            print("no traps found")
    return EXIT_PROBLEM if any(f.severity == "error" for f in findings) else EXIT_OK


def doctor_findings(session, causes: dict[str, str]) -> list:
    """What one look raised, as findings: the detectors' (the whole registry, on what was read),
    then what the feeds raised themselves (a training run's anomalies, the reference it is worse
    than, a rank that died), then the checkpoint each dead training run would resume from.
    The alerts of a run's end are doctor's `deaths`."""
    from samai.console.core.alertbook import FIRE_FAILED, RUN_ENDED
    from samai.console.core.fixes import FixAction
    from samai.console.core.problems import Finding
    from samai.console.core.training.feed import RESUME_AVAILABLE, TrainingFeed

    state = session.state
    assert state.snapshot is not None
    findings = state.detectors.run(state.detector_context(state.snapshot))
    skipped = {RUN_ENDED, FIRE_FAILED, RESUME_AVAILABLE, "box_unreachable"}
    findings += [Finding(a.code, a.severity, a.text, a.action) for a in reversed(state.active_alerts())
                 if a.code and a.finding is None and a.code not in skipped]
    training = state.feed(TrainingFeed)
    for stage, choice in (training.choices.items() if training else ()):
        if stage in causes and choice.chosen is not None:
            findings.append(Finding(RESUME_AVAILABLE, "warning",
                                    f"stage {stage} died ({causes[stage]}); it can resume from {choice.path} (step "
                                    f"{choice.chosen.step}) instead of step 0: fire {stage} --resume",
                                    FixAction.resume(stage), checkpoint=choice.path))
    return findings


def _deaths(cfg: config_mod.Config, snap: Snapshot) -> list[dict]:
    """Each stage's last run that did not end well (a stop aside), with why."""
    from samai.console.core.death import cause_of_death, death_json

    found = []
    for stage in cfg.stages:
        rec = snap.state(stage.name)
        death = cause_of_death(rec, snap) if rec else None
        if rec is not None and death is not None and death.cause != "stopped":
            found.append(dict(stage=stage.name, rc=rec.rc, fired_at=rec.fired_at, **(death_json(death) or {})))
    return found


async def _eval(args, cfg, box: Box) -> int:
    from samai.console import cli_runs

    try:
        return await cli_runs.eval_command(args, cfg, box)
    except cli_runs.RunMissing as e:
        return fail(str(e), EXIT_USAGE)


async def _timeline(args, cfg, box: Box) -> int:
    from samai.console import cli_runs

    return await cli_runs.timeline_command(args, cfg, box, _since(args))


async def _incident(args, cfg, box: Box) -> int:
    from samai.console import cli_runs

    return await cli_runs.incident_command(args, cfg, box, _since(args))


def _since(args) -> float | None:
    from samai.console import cli_runs

    try:
        return time.time() - cli_runs.since_seconds(args.since) if args.since else None
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"--since {e}") from None


async def _check(args, cfg, box: Box) -> int:
    from samai.console.core import checks  # with the box's GGUF checker: only `check` needs it

    path = _on_target(cfg, args.path)
    if args.deep and not (args.kind == "gguf" and cfg.target.is_local):
        raise UsageError("--deep reads the file with gguf-py on this machine: only for check gguf on a local target")
    if args.against and args.kind != "trainlog":
        raise UsageError("--against compares two training logs: only for check trainlog")
    result: CheckResult
    try:
        if args.kind == "gguf":
            model = dict(cfg.model)
            result = await checks.check_gguf(box, path, expect_tensors=args.expect_tensors or
                                             model.get("gguf_tensor_count"),
                                             expect_last=args.expect_last or model.get("gguf_last_tensor"),
                                             local=cfg.target.is_local, deep=args.deep)
        elif args.kind == "trainlog":
            result = await checks.check_trainlog(box, path)  # streamed: memory holds the points, not the log
            if args.against:
                return await _against(args, cfg, box, path, result)
        else:
            from samai.console.core.evals.runs import NotReadWhole, check_file

            try:
                result = await check_file(box, path)  # whole, streamed: an item of megabytes stays one item
            except NotReadWhole as e:
                return fail(str(e), EXIT_USAGE)
    except (checks.Unreadable, ValueError) as e:  # ValueError: a trainer_state.json that is not JSON
        return fail(str(e), EXIT_USAGE)
    shown = result.to_json()  # the JSON contract; the text report reads the same figures
    print(_json(shown) if args.json else describe_check(args.kind, path, shown))
    return EXIT_PROBLEM if checks.has_errors(result) else EXIT_OK


async def _against(args, cfg, box: Box, path: str, result) -> int:
    """`check trainlog A --against B`: A's check, and its comparison with B's points."""
    from samai.console.core import checks
    from samai.console.core.training.trainref import Reference, compare

    against = _on_target(cfg, args.against)
    reference = Reference(args.against, (await checks.check_trainlog(box, against)).points)
    worse = compare(result.points, reference, cfg.train)
    shown = result.to_json()
    shown["reference"] = {"path": against, "points": len(reference.points), "factor": cfg.train.compare_factor,
                          "steps": cfg.train.compare_steps, "smooth": cfg.train.compare_smooth}
    if worse is not None:
        shown["anomalies"].append(worse.to_json())
    verdict = "" if worse else (f"\nagainst {visible(args.against)}: no step worse than {cfg.train.compare_factor:g}× "
                                f"its smoothed loss for {cfg.train.compare_steps} logged steps in a row "
                                f"({len(reference.points)} reference points)")
    print(_json(shown) if args.json else describe_check(args.kind, path, shown) + verdict)
    return EXIT_PROBLEM if checks.has_errors(result) or worse is not None else EXIT_OK


def _on_target(cfg, path: str) -> str:
    """Paths given to commands are paths on the target; relative ones are in the workspace."""
    return cfg.path_of(path)


def _json_bytes(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(type(value).__name__)


def _line_filter(pattern: str | None):
    if not pattern:
        return lambda line: True
    invert = pattern.startswith("!")
    try:
        rx = re.compile(pattern[1:] if invert else pattern)
    except re.error as e:
        raise UsageError(f"--grep {pattern!r}: not a regular expression ({e})") from e
    return lambda line: bool(rx.search(line)) != invert


async def _tail(args, cfg, box: Box) -> int:
    if args.n < 0:
        raise UsageError("-n must be 0 or more")
    keep = _line_filter(args.grep)
    passthrough = args.raw and not args.grep  # the bytes as read, not lines decoded from them
    emit = _raw_line if args.raw else _visible_line
    follower = LogFollower(_on_target(cfg, args.path), last_lines=args.n, catch_up_bytes=CATCH_UP_READ)
    while True:
        chunk = await (_read_through_outages(box, follower) if args.follow else box.read_log(follower.cursor()))
        update = follower.consume(chunk)
        if update.notice:
            print(f"samai-console: {visible(update.notice)}", file=sys.stderr)
        if follower.missing and (not args.follow or follower.refused):
            return EXIT_PROBLEM
        if passthrough:
            sys.stdout.buffer.write(b"\n" * update.cut_line + chunk.data)
        else:
            for line in update.lines:
                if keep(line):
                    emit(line)
        sys.stdout.flush()
        if update.more:
            continue
        if not args.follow:
            last = follower.decoder.flush()
            if last is not None and keep(last) and not passthrough:
                emit(last)
            return EXIT_OK
        await asyncio.sleep(FOLLOW_POLL_S)


async def _read_through_outages(box: Box, follower: LogFollower):
    """The next read of a followed log; while the box does not answer, retried with a growing
    pause (said once on stderr), then resumed at the same byte offset: nothing twice, nothing lost."""
    from samai.console.core.backoff import Backoff

    backoff, down = Backoff(FOLLOW_POLL_S), None
    while True:
        try:
            chunk = await box.read_log(follower.cursor())
        except (BoxError, TransportError) as e:
            if down is None:
                down = time.monotonic()
                print(f"samai-console: the box is not answering ({visible(str(e) or type(e).__name__)}); "
                      "retrying", file=sys.stderr, flush=True)
            await asyncio.sleep(backoff.failed())
            continue
        if down is not None:
            print(f"samai-console: reconnected after {time.monotonic() - down:.0f} s; resuming at byte "
                  f"{follower.cursor().offset}", file=sys.stderr, flush=True)
        return chunk


def _visible_line(line: str) -> None:
    print(visible(line))


def _raw_line(line: str) -> None:
    """A decoded line as it was (only `tail --raw --grep` prints these): escapes reach the terminal."""
    sys.stdout.buffer.write(line.encode("utf-8", "surrogateescape") + b"\n")


# ------------------------------------------------------------------ actions


def _actions(args, cfg, box: Box) -> Actions:
    from samai.console.core.actions import Actions  # the action layer (and psutil): only for a command that acts
    from samai.console.core.audit import AuditLog
    from samai.console.core.paths import audit_log
    from samai.console.core.secret_mask import SecretMask

    return Actions(box, cfg, AuditLog(audit_log(), SecretMask.of_config(cfg)), readonly=args.readonly,
                   confirm=_confirmer(args.yes, getattr(args, "force", False)))


def _confirmer(yes: bool, force: bool = False):
    """The command line's side of the one policy: a blocked plan needs --force and a confirmation
    (--yes, or "y" at a prompt that shows it blocked); without a terminal, only --yes confirms."""
    from samai.console.core.actions import Decision  # see _actions

    async def confirm(plan: ActionPlan) -> Decision:
        for check in plan.checks:
            mark = {"ok": "✓", "warning": "!", "error": "✗"}.get(check.severity, "?")
            print(f"  {mark} {visible(check.text)}", file=sys.stderr)
        if plan.blocked and not force:
            return Decision.declined(plan, "the preflight blocks it; add --force to run it anyway")
        if yes:
            return Decision.override(plan, "--force --yes") if plan.blocked else Decision.confirmed(plan, "--yes")
        if not sys.stdin.isatty():
            need = "--force --yes" if plan.blocked else "--yes"
            return Decision.declined(plan, f"needs confirmation: run it at a terminal or pass {need}")
        _show(plan)
        answer = await asyncio.to_thread(input, "Run it anyway? [y/N] " if plan.blocked else "Proceed? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return Decision.declined(plan, "declined at the prompt")
        return Decision.override(plan, "--force prompt") if plan.blocked else Decision.confirmed(plan, "prompt")

    return confirm


def _show(plan: ActionPlan) -> None:
    print(f"{plan.action} {visible(plan.subject)} on {visible(plan.target)}\n  {visible(plan.command)}",
          file=sys.stderr)
    for line in plan.details:
        print(f"  {visible(line)}", file=sys.stderr)
    if plan.blocked:
        print("  BLOCKED by the preflight (✗ above): --force runs it anyway", file=sys.stderr)


def _report(outcome: ActionOutcome, cfg: config_mod.Config) -> int:
    """What came of an action, its secrets masked as its audit line's are (the config's, by place too)."""
    from samai.console.core.secret_mask import SecretMask

    mask = SecretMask.of_config(cfg)
    result = outcome.result
    stream = sys.stdout if outcome.ok else sys.stderr
    print(f"samai-console: {visible(mask(outcome.message))}", file=stream)
    for line in getattr(result, "stage_tail", ()) if not outcome.ok else ():
        print(f"  | {visible(mask(line))}", file=stream)
    return EXIT_OK if outcome.ok else EXIT_PROBLEM


async def _fire(args, cfg, box: Box) -> int:
    from samai.console import cli_multinode  # a stage with nodes fires on every node at once

    if cli_multinode.is_multi_node(cfg, args.stage):
        return await cli_multinode.fire(cfg, args.stage, readonly=args.readonly,
                                        confirm=_confirmer(args.yes, getattr(args, "force", False)))
    if args.resume is not None:
        from samai.console.core.training.resume import NothingToResume

        try:
            return _report(await _actions(args, cfg, box).resume(args.stage, args.resume or None), cfg)
        except NothingToResume as e:  # names checkpoints (box text): said inert
            return fail(f"cannot resume {args.stage}: {e}", EXIT_PROBLEM)
    return _report(await _actions(args, cfg, box).fire(args.stage), cfg)


async def _stop(args, cfg, box: Box) -> int:
    from samai.console import cli_multinode  # a stage with nodes stops on every node

    if cli_multinode.is_multi_node(cfg, args.stage):
        return await cli_multinode.stop(cfg, args.stage, readonly=args.readonly, confirm=_confirmer(args.yes),
                                        grace=args.grace)
    return _report(await _actions(args, cfg, box).stop(args.stage, grace=args.grace), cfg)


async def _kill(args, cfg, box: Box) -> int:
    outcome = await _actions(args, cfg, box).kill(args.pid, args.start_time, signal=args.signal, grace=args.grace,
                                                  group=args.group)
    return _report(outcome, cfg)


# ------------------------------------------------------------------ gguf


async def _gguf(args, cfg, box: Box) -> int:
    if args.gguf_command == "show":
        return await _gguf_show(args, cfg, box)
    actions = _actions(args, cfg, box)
    try:
        outcome = await actions.gguf(_gguf_request(args, cfg))
    except ValueError as e:
        raise UsageError(str(e)) from e
    result = outcome.result
    stream = sys.stdout if outcome.ok else sys.stderr
    for a in getattr(result, "assertions", ()):
        print(f"  {'✓' if a.ok else '✗'} {a.name}: {visible(a.detail)}", file=stream)
    rc = _report(outcome, cfg)
    if rc != EXIT_OK or not args.smoke:
        return rc
    from samai.console.core.serving.smoke import smoke

    try:
        checked = await smoke(actions, _on_target(cfg, args.out))
    except ValueError as e:
        raise UsageError(str(e)) from e
    print(f"samai-console: smoke: {visible(checked.said)}", file=sys.stdout if checked.ok else sys.stderr)
    return EXIT_OK if checked.ok else EXIT_PROBLEM


def _gguf_request(args, cfg) -> dict:
    """The box tool's request, exactly as the command line gives it."""
    op = args.gguf_command.replace("-", "_")
    request: dict = {"op": op, "path": _on_target_or_url(cfg, args.path), "out": args.out}
    if op == "set_kv":
        pairs = [_assignment(a) for a in args.assignments]
        request["set"] = dict(pairs)
        if args.type:
            request["types"] = {key: args.type for key, _ in pairs}
    else:
        request["tensors"] = args.tensor
    if op == "add_tensors":
        request["donor"] = _on_target_or_url(cfg, args.donor)
        if args.expect_tensors is not None:
            request["expect_tensors"] = args.expect_tensors
        if args.expect_last is not None:
            request["expect_last"] = args.expect_last
    if args.redirect_hosts:
        request["redirect_hosts"] = args.redirect_hosts
    return request


def _assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"{text!r} is not KEY=VALUE")
    return key, value


def _on_target_or_url(cfg, path: str) -> str:
    """An empty path stays empty: the action layer names it, instead of it becoming the workspace."""
    return path if not path or path.startswith(("http://", "https://")) else _on_target(cfg, path)


async def _gguf_show(args, cfg, box: Box) -> int:
    path = _on_target_or_url(cfg, args.path)
    try:
        header = await box.gguf_show(path, redirect_hosts=args.redirect_hosts or ())
    except BoxError as e:  # the box answered: the file or donor is refused (a bad reply header, a redirect)
        return fail(redact(f"gguf show {path}: {e}"), EXIT_PROBLEM)  # a pre-signed donor URL holds one
    if args.json:
        print(_json(dict(asdict(header), ok=header.ok)))
    else:
        print("\n".join(visible(line) for line in describe_gguf(header)))
    return EXIT_OK if header.ok else EXIT_PROBLEM


def describe_gguf(header) -> list[str]:
    """gguf show as text: the layout, every KV, the tensor table, the checker's problems."""
    lines = [f"{header.path}: {'OK' if header.ok else 'PROBLEMS'}",
             f"  GGUF v{header.version}, {header.kv_count} KVs, {header.tensor_count} tensors, alignment "
             f"{header.alignment}, size {header.file_size}",
             f"  header_end {header.header_end}, data_start {header.data_start}, data_end {header.data_end}"]
    lines += [f"  {kv.key} [{kv.type}] = {kv.value}" for kv in header.kvs]
    if header.kvs_left_out:
        lines.append(f"  ... and {header.kvs_left_out} more KVs")
    if header.tensors:
        lines.append(f"  {'name':<40} {'type':<8} {'shape':<20} {'offset':>14} {'size':>12}")
    for t in header.tensors:
        shape, size = "x".join(map(str, t.shape)), "?" if t.size is None else t.size
        lines.append(f"  {t.name:<40} {t.type:<8} {shape:<20} {t.offset:>14} {size:>12}")
    if header.tensors_left_out:
        lines.append(f"  ... and {header.tensors_left_out} more tensors")
    lines += [f"  {p.severity} {p.code}" + (f" @{p.offset}" if p.offset is not None else "") + f": {p.message}"
              for p in header.problems]
    return lines
