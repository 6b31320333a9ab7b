"""The command line. Exit codes: 0 ok, 1 a check found a problem or an action was refused,
2 a usage, config or connection error, always with a one-line reason on stderr; 141 (as a
process killed by SIGPIPE) when whatever reads stdout closed it early (`snapshot | head`).

Text output shows every control character that comes from the box as a visible stand-in
(samai.remote.safe_text): a process's command line or a log line cannot retitle, recolour or
rewrite the operator's terminal. `--json` output is exact and pure ASCII (json.dumps escapes
every control character, C1 and U+2028 included); `tail --raw` passes the log's bytes through."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import select
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from samai.console import __version__
from samai.console.cli_common import EXIT_STDOUT_CLOSED, EXIT_USAGE, UsageError, fail
from samai.console.core import config as config_mod
from samai.remote.errors import BoxError
from samai.remote.safe_text import visible
from samai.remote.targets import TargetError
from samai.remote.transport import TransportError

if TYPE_CHECKING:
    pass

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {visible(message)} (see --help)\n")


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--config", metavar="FILE", default=default, help="samai.toml (default: built-in tiny)")
    parser.add_argument("--target", metavar="URL", default=default,
                        help="local, ssh://user@host[:port] or envelope+http(s)://host[:port]")
    parser.add_argument("--box", metavar="NAME", default=default, help="the [boxes.NAME] box to work on")
    parser.add_argument("--readonly", action="store_true", default=argparse.SUPPRESS if suppress else False,
                        help="refuse every action that changes the box")
    parser.add_argument("--theme", metavar="NAME", default=default, help="the TUI's theme")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="samai-console", description="Operations console for an LLM fine-tuning box.")
    parser.add_argument("--version", action="version", version=f"samai-console {__version__}")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _global_options(p, suppress=True)
        return p

    p = command("snapshot", "one snapshot of the box: disk, stages, processes, ports")
    p.add_argument("--json", action="store_true", help="the whole snapshot as JSON")
    p.add_argument("--all-boxes", action="store_true",
                   help="every box of the config at once, each with its own deadline (JSON: {\"boxes\": {NAME: …}})")

    p = command("fire", "start a stage (detached, verified) after its preflight")
    p.add_argument("stage")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--force", action="store_true",
                   help="fire even when the preflight blocks it (still confirmed: at the prompt, or with --yes)")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="CHECKPOINT",
                   help="a train stage: continue its dead run from a checkpoint (the newest whole, finite one "
                        "before the log's first anomaly when none is named; a named one that is not is refused)")

    p = command("stop", "stop a running stage: its process group, TERM then KILL")
    p.add_argument("stage")
    p.add_argument("--grace", type=float, default=10.0, metavar="S", help="seconds between TERM and KILL")
    p.add_argument("--yes", action="store_true")

    p = command("kill", "signal one process, identified by pid and start time")
    p.add_argument("pid", type=int)
    p.add_argument("--start-time", type=float, required=True, metavar="T",
                   help="the process's start time (epoch seconds, as `snapshot --json` shows it)")
    p.add_argument("--signal", choices=("TERM", "KILL", "INT", "HUP"), default="TERM", type=str.upper)
    p.add_argument("--grace", type=float, default=5.0, metavar="S", help="seconds before KILL follows TERM")
    p.add_argument("--group", action="store_true", help="signal its whole process group, not just the process")
    p.add_argument("--yes", action="store_true")

    p = command("budget", "the disk plan: each stage's peak against capacity, and what is on disk now")
    p.add_argument("--json", action="store_true")

    p = command("doctor", "look for the playbook's traps on the box: writers, ports, servers, poison, disk")
    p.add_argument("--json", action="store_true")

    p = command("check", "judge a GGUF, a training log or an eval run on the box")
    p.add_argument("kind", choices=("gguf", "trainlog", "eval"))
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.add_argument("--expect-tensors", type=int, metavar="N", help="gguf: the tensor count it must have")
    p.add_argument("--expect-last", metavar="NAME", help="gguf: the name its last tensor must have")
    p.add_argument("--deep", action="store_true",
                   help="gguf, local target only: also read the whole file with gguf-py's GGUFReader (its whole "
                        "vocabulary: seconds and hundreds of MB for a real model)")
    p.add_argument("--against", metavar="REFERENCE",
                   help="trainlog: compare with the log of a run that went well, step by step (worse_than_reference "
                        "when the smoothed loss stays over [train] compare_factor times its own)")

    _gguf_parser(command("gguf", "GGUF surgery on the box: show a header, set a KV, add or extract tensors"))
    _eval_parser(command("eval", "compare the box's eval runs"))
    p = command("incident", "one file a colleague can open anywhere: the timeline, the snapshot, the logs' ends, "
                            "the findings, the config (secrets masked)")
    p.add_argument("--out", required=True, metavar="FILE", help="the bundle to write (JSON)")
    p.add_argument("--since", metavar="DURATION", help="the timeline's last DURATION only (90s, 45m, 2h, 3d)")
    p = command("replay", "open an incident bundle in the TUI, read-only, on any machine (no box needed)")
    p.add_argument("file", metavar="FILE")
    p = command("timeline", "what happened on the box, in order: runs, markers, ends and why, stops, actions")
    p.add_argument("--since", metavar="DURATION", help="only the last DURATION (90s, 45m, 2h, 3d)")
    p.add_argument("--json", action="store_true", help='{"events": [{"time", "source", "kind", "text", ...}]}')

    # Listed for --help; their own parsers take their arguments (see STANDALONE).
    sub.add_parser("envelope-server", help="run the reference exec gateway (token from SAMAI_ENVELOPE_TOKEN)",
                   add_help=False)
    sub.add_parser("lint-payload", help="check that a payload survives the gateway's exec()", add_help=False)

    p = command("watch", "watch the box with nobody at the keys: notify (apprise) what goes wrong, and what resolves")
    p.add_argument("--notify", action="append", default=[], metavar="URL",
                   help="an apprise URL to send to, on top of [notify] urls (one holding a credential is refused "
                        "here: give it in the config or the environment variable [notify] urls_env names)")
    p.add_argument("--once", action="store_true", help="one poll, send what is due, exit (for cron)")
    p.add_argument("--all-boxes", action="store_true", help="every box of the config, each on its own")
    p.add_argument("--interval", type=float, metavar="S", help="seconds between polls (default: [watch] interval)")

    p = command("tail", "print the end of a file on the box (relative paths are in the workspace)")
    p.add_argument("path")
    p.add_argument("-n", type=int, default=10, metavar="N", help="start with the last N lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing what is appended")
    p.add_argument("--grep", metavar="REGEX", help="only lines matching REGEX (a leading ! inverts)")
    p.add_argument("--raw", action="store_true",
                   help="pass the log's bytes through unchanged, terminal escapes included (default: shown "
                        "as visible stand-ins); with --grep, the matching lines as decoded")
    return parser


def _gguf_parser(parent: argparse.ArgumentParser) -> None:
    """`gguf show|set-kv|add-tensors|extract`: each write is an action (planned, confirmed, audited)."""
    sub = parent.add_subparsers(dest="gguf_command", metavar="OP", parser_class=_Parser, required=True)

    def op(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _global_options(p, suppress=True)
        return p

    def redirects(p: argparse.ArgumentParser) -> None:
        p.add_argument("--allow-redirect", action="append", dest="redirect_hosts", metavar="HOST",
                       help="a host a URL may redirect to besides its own (repeatable; https never goes to http)")

    def writes(p: argparse.ArgumentParser) -> None:
        redirects(p)
        p.add_argument("--out", required=True, metavar="OUT",
                       help="the new file, inside the workspace (written as OUT.part, checked, then renamed)")
        p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        p.add_argument("--force", action="store_true", help="run it even when the plan is blocked (disk budget)")
        p.add_argument("--smoke", action="store_true",
                       help="then serve OUT with the pipeline's serve stage on a free port and check its smoke answer")

    def tensors(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tensor", action="extend", nargs="+", required=True, metavar="NAME",
                       help="tensor names (repeatable, each taking one or more)")

    p = op("show", "a GGUF's header, KVs and tensor table (name, type, shape, offset, size)")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    redirects(p)

    p = op("set-kv", "a copy of a GGUF with KVs set (the type of an existing key is kept)")
    p.add_argument("path")
    p.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    p.add_argument("--type", metavar="T", help="the type of a new key: u8..u64, i8..i64, f32, f64, bool, str, arr[T]")
    writes(p)

    p = op("add-tensors", "a copy of a GGUF with tensors added from a donor (on the box, or a URL read by range)")
    p.add_argument("path")
    p.add_argument("--from", dest="donor", required=True, metavar="DONOR")
    tensors(p)
    p.add_argument("--expect-tensors", type=int, metavar="N", help="the tensor count the output must have")
    p.add_argument("--expect-last", metavar="NAME", help="the name the output's last tensor must have")
    writes(p)

    p = op("extract", "a small GGUF with the input's KVs and just the named tensors (a URL is read by range)")
    p.add_argument("path", metavar="PATH|URL")
    tensors(p)
    writes(p)


def _eval_parser(parent: argparse.ArgumentParser) -> None:
    sub = parent.add_subparsers(dest="eval_command", metavar="OP", parser_class=_Parser, required=True)
    help_text = "two eval runs item by item: what changed, and whether the change is more than noise"
    p = sub.add_parser("diff", help=help_text, description=help_text)
    _global_options(p, suppress=True)
    p.add_argument("a", metavar="RUN_A", help="a run as the eval pane names it, its folder, or its items.jsonl")
    p.add_argument("b", metavar="RUN_B")
    p.add_argument("--json", action="store_true")


def main(argv: Sequence[str] | None = None) -> int:
    _replace_unencodable(sys.stdout, sys.stderr)
    from samai.console.core.paths import warnings_log
    from samai.console.warnings_log import route_to

    route_to(warnings_log())  # a library's warning never breaks the one-line stderr contract
    try:
        code = _main(argv)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's exit
        return code
    except BrokenPipeError as e:
        if _stdout_gone():
            return _stdout_closed()
        return fail(f"a pipe broke: {e}", EXIT_USAGE)  # not stdout's: say so, in one line


def _replace_unencodable(*streams) -> None:
    """A terminal whose encoding lacks the stand-ins (␛) gets an escape for them, not a traceback."""
    for stream in streams:
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _stdout_gone() -> bool:
    """Whether stdout's reader went away (a pipe or socket with no reader polls as an error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real stdout to ask: it is the one that broke
        return True


def _stdout_closed() -> int:
    """Quiet exit when stdout's reader is gone (Python's documented recipe): what is still
    buffered goes to /dev/null, so the interpreter's own flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_STDOUT_CLOSED


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["envelope-server"], ["lint-payload"]):  # tools that need neither a config nor a box
        return _standalone(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    cfg: config_mod.Config | None = None
    try:
        cfg = config_mod.load(args.config)
        if args.command == "watch":
            return _watch(args, cfg)
        if getattr(args, "all_boxes", False):
            from samai.console import cli_box

            return asyncio.run(cli_box.snapshot_all(args, cfg))
        if args.command == "replay":
            return _replay(args)
        if args.command is None:
            _on_box(cfg, args.box)  # an unknown name is a usage error before the TUI starts
            if args.box and args.target:
                raise UsageError("--box opens one of the config's boxes; --target names another: give one")
            gc.disable()  # what the TUI imports and builds to start lives as long as it: see run_app
            from samai.console.app import run_app  # the TUI's imports are kept off the commands' path

            cfg = cfg.with_target(args.target) if args.target else cfg
            return run_app(cfg, readonly=args.readonly, theme=args.theme, box=args.box)
        cfg = _on_box(cfg, args.box)
        if args.target:
            cfg = cfg.with_target(args.target)
        from samai.console import cli_box  # the Box and the commands: off the TUI's path

        return asyncio.run(cli_box.run(args, cfg))
    except (config_mod.ConfigError, UsageError, TargetError) as e:
        return fail(str(e), EXIT_USAGE)
    except (BoxError, TransportError) as e:
        from samai.console.core.secret_mask import SecretMask

        mask = SecretMask.of_config(cfg) if cfg is not None else SecretMask()  # a URL or the box may quote one
        return fail(mask(f"cannot reach {args.target or 'the target'}: {e}"), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130


def _replay(args: argparse.Namespace) -> int:
    """An incident bundle in the TUI, read-only: no box is asked anything."""
    from pathlib import Path

    from samai.console.core.incident import NotABundle, read_bundle

    try:
        bundle = read_bundle(Path(args.file))
    except NotABundle as e:
        return fail(str(e), EXIT_USAGE)
    gc.disable()  # as for the TUI: see run_app
    from samai.console.app import run_replay

    return run_replay(bundle, theme=args.theme)


def _watch(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    from samai.console import cli_watch  # apprise and the watcher: off every other command's path

    if args.all_boxes and (args.box or args.target):
        raise UsageError("--all-boxes watches every box the config declares: give it without --box or --target")
    if args.interval is not None and not 0.1 <= args.interval <= 86400:
        raise UsageError("--interval: seconds between polls, from 0.1 to 86400")
    cfg = _on_box(cfg, args.box)
    if args.target:
        cfg = cfg.with_target(args.target)
    return asyncio.run(cli_watch.run(cfg, notify=args.notify, once=args.once, all_boxes=args.all_boxes,
                                     readonly=args.readonly, interval=args.interval))


def _on_box(cfg: config_mod.Config, name: str | None) -> config_mod.Config:
    """The config as seen on box `name` (--box); None: as it is."""
    if name is None:
        return cfg
    try:
        return cfg.on_box(name)
    except KeyError:
        declared = ", ".join(b.name for b in cfg.boxes) or "none: it has no [boxes.NAME] tables"
        raise UsageError(f"unknown box {name!r} (boxes in {cfg.source}: {declared})") from None


def _standalone(command: str, argv: list[str]) -> int:
    if command == "envelope-server":
        from samai.remote import gateway

        return gateway.main(argv)
    from samai.remote import payload_lint

    return payload_lint.main(argv)



