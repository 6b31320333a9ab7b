"""The gateway's command line: ``python -m samai.remote.gateway`` (also ``samai-console envelope-server``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from samai.remote.gateway.faults import FAULT_MODES
from samai.remote.gateway.limits import HEADER_TIMEOUT_S, MAX_ACTIVE, MAX_PENDING, MAX_PENDING_PER_CLIENT, Limits
from samai.remote.gateway.protocol import DEFAULT_HARD_CUT_S, DEFAULT_MAX_BODY, DEFAULT_PORT, DEFAULT_TOKEN_ENV
from samai.remote.gateway.server import build_server


def positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} is not a positive number")
        return value
    return parse


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m samai.remote.gateway",
        description="A local HTTP exec-envelope gateway (the protocol: docs/envelope-protocol.md).")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"0 picks a free port (default {DEFAULT_PORT})")
    parser.add_argument("--prefix", default="", help="path prefix before /execute, e.g. /gw")
    parser.add_argument("--token-env", default=DEFAULT_TOKEN_ENV, metavar="NAME",
                        help=f"environment variable holding the bearer token (default {DEFAULT_TOKEN_ENV})")
    parser.add_argument("--hard-cut", type=positive(float), default=DEFAULT_HARD_CUT_S, metavar="SECONDS",
                        help="cap on any request's timeout (default 180)")
    parser.add_argument("--max-body", type=positive(int), default=DEFAULT_MAX_BODY, metavar="BYTES",
                        help="largest accepted payload (default 4 MiB)")
    parser.add_argument("--header-timeout", type=positive(float), default=HEADER_TIMEOUT_S, metavar="SECONDS",
                        help=f"the request line and headers must arrive within this (default {HEADER_TIMEOUT_S:g})")
    parser.add_argument("--max-pending", type=positive(int), default=MAX_PENDING, metavar="N",
                        help=f"connections still sending their headers, in all (default {MAX_PENDING})")
    parser.add_argument("--max-pending-per-client", type=positive(int), default=MAX_PENDING_PER_CLIENT, metavar="N",
                        help=f"the same, from one address (default {MAX_PENDING_PER_CLIENT})")
    parser.add_argument("--max-active", type=positive(int), default=MAX_ACTIVE, metavar="N",
                        help=f"requests with the token served at once; more are answered 503 (default {MAX_ACTIVE})")
    parser.add_argument("--faults", action="store_true", help="enable fault injection and POST/GET/DELETE /_faults")
    parser.add_argument("--fault", choices=FAULT_MODES, metavar="MODE",
                        help=f"a standing fault for every request (needs --faults): {', '.join(FAULT_MODES)}")
    return parser


def parse_arguments(argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code argparse chose (--help, a usage error)."""
    parser = argument_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    if args.fault and not args.faults:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: --fault needs --faults", file=sys.stderr)
        return 2
    return args


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if isinstance(args, int):
        return args
    token = os.environ.get(args.token_env, "")
    if not token:
        print(f"envelope-server: no token: set the environment variable {args.token_env} "
              "(clients must send it as 'Authorization: Bearer TOKEN')", file=sys.stderr)
        return 2
    limits = Limits(max_pending=args.max_pending, max_pending_per_client=args.max_pending_per_client,
                    max_active=args.max_active, header_timeout_s=args.header_timeout)
    try:
        server = build_server(token, host=args.host, port=args.port, prefix=args.prefix, token_env=args.token_env,
                              hard_cut_s=args.hard_cut, max_body=args.max_body, faults=args.faults, fault=args.fault,
                              limits=limits)
    except ValueError as e:  # the limits do not fit the open-file limit
        print(f"envelope-server: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"envelope-server: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"listening on {server.url}", flush=True)
    server.log(server.settings.limits.describe())
    if args.faults:
        server.log("fault injection is ON" + (f" (standing fault: {args.fault})" if args.fault else ""))
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.release()
    return 0
