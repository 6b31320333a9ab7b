"""A stand-in for the HTTP "exec envelope" gateway that some boxes are reachable through, with fault injection.

It reproduces the gateway closely enough that the console's envelope client and the payloads it sends can be
tested on one machine: same request and reply shapes, same execution traps, and on demand the same failures.
The protocol it speaks (requests, checks, execution, replies, limits, faults, logging, command line) is
described in docs/envelope-protocol.md.

In-process (tests): ``with serve(token, port=0, faults=True) as server: httpx.post(server.url + "/execute", ...)``;
``server.faults.arm("500", count=1)`` is the Python side of ``POST /_faults``.
"""

from samai.remote.gateway.cli import main
from samai.remote.gateway.faults import FAULT_MODES, Fault, FaultError, FaultPlan
from samai.remote.gateway.limits import Limits
from samai.remote.gateway.protocol import DEFAULT_HARD_CUT_S, DEFAULT_MAX_BODY, DEFAULT_PORT, DEFAULT_TOKEN_ENV
from samai.remote.gateway.server import EnvelopeServer, build_server, serve

__all__ = [
    "DEFAULT_HARD_CUT_S", "DEFAULT_MAX_BODY", "DEFAULT_PORT", "DEFAULT_TOKEN_ENV", "FAULT_MODES", "EnvelopeServer",
    "Fault", "FaultError", "FaultPlan", "Limits", "build_server", "main", "serve",
]
