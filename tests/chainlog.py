"""Stage logs as the box's launcher writes them (remote/box/chainline.py), for the tests that
plant a log instead of running a stage: the run's header first, its chain's lines with its nonce,
the stage's own lines between."""

from __future__ import annotations

from samai.remote.box.chainline import signed

NONCE = "0123456789abcdef"


def nonce_of(pid: int) -> str:
    """A nonce of the launcher's shape, one per pid (a log's runs told apart)."""
    return f"{pid:016x}"[-16:]


def header(stage: str, pid: int, started: str = "2026-12-01T00:00:00Z", nonce: str | None = None) -> str:
    return signed(f"=== samai chain {stage}: pid {pid} started {started}", nonce or nonce_of(pid))


def chain(text: str, pid: int, nonce: str | None = None) -> str:
    """One of the chain's own lines (SAMAI_DISK, SAMAI_DEATH, CHAIN_DONE ...) of the run of that pid."""
    return signed(text, nonce or nonce_of(pid))


def run_log(stage: str, pid: int, lines: list[str], rc: int | None = 0, *, started: str = "2026-12-01T00:00:00Z",
            death: str = "") -> str:
    """A whole run's log: header, the stage's lines, its cause of death when given, CHAIN_DONE
    (none for rc None: the chain was killed, or it still runs)."""
    out = [header(stage, pid, started), *lines]
    if death:
        out.append(chain(f"SAMAI_DEATH {death}", pid))
    if rc is not None:
        out.append(chain(f"CHAIN_DONE rc={rc}", pid))
    return "\n".join(out) + "\n"
