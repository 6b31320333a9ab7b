"""A populated workspace for the idle benchmark: the tiny pipeline with every stage run once.

    python bench/populated.py FOLDER [--venv VENV] [--port 18080]

Fires the built-in tiny pipeline's stages one after the other through the Box, as the console
fires them (provision, or a link to an already provisioned VENV; fetch, train, merge, convert,
quantize, serve, eval), each waited for and required to end well; the server is left running.
Writes FOLDER/samai.toml (the tiny pipeline on FOLDER/ws, serving on --port) and prints its path:

    python bench/idle.py --box shared --config FOLDER/samai.toml --seconds 120 --settle 10

Stop the server afterwards with `samai-console --config FOLDER/samai.toml stop serve --yes`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from harness import argument_parser

from samai.console.core import config
from samai.remote.boxapi import Box
from samai.remote.local import LocalTransport

STAGES = ("fetch", "train", "merge", "convert", "quantize", "serve", "eval")


async def run(box: Box, cfg: config.Config, name: str) -> None:
    """Fire a stage and wait until its chain ends (serve: until it answers its smoke question)."""
    stage = cfg.stage(name)
    fired = await box.fire(stage.name, stage.command, stage.log, env=dict(stage.env), verify_s=1.0)
    if fired.state == "refused":
        raise SystemExit(f"{name} refused: {fired.reason}")
    log = Path(cfg.workspace, stage.log)
    started = time.monotonic()
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if name == "serve" and "SMOKE_OK" in text:
            break
        rec = (await box.snapshot(processes=True)).state(name)
        if rec is not None and rec.rc is not None:
            if rec.rc != 0:
                raise SystemExit(f"{name} ended rc={rec.rc}:\n{text[-3000:]}")
            break
        await asyncio.sleep(1)
    print(f"{name}: done in {time.monotonic() - started:.0f} s", file=sys.stderr)


async def populate(folder: Path, venv: Path | None, port: int) -> Path:
    ws = folder / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    text = config.builtin_text("tiny").replace("18080", str(port)) + f'\n[workspace]\npath = "{ws}"\n'
    path = folder / "samai.toml"
    path.write_text(text, "utf-8")
    cfg = config.load(path)
    box = Box(LocalTransport(), str(ws), python=sys.executable)
    try:
        if venv is not None:
            (ws / "venv").symlink_to(venv.resolve())
        else:
            await run(box, cfg, "provision")
        for name in STAGES:
            await run(box, cfg, name)
    finally:
        await box.close()
    return path


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--venv", type=Path, help="an already provisioned box venv to link instead of provisioning")
    parser.add_argument("--port", type=int, default=18080)
    args = parser.parse_args()
    print(asyncio.run(populate(args.folder, args.venv, args.port)))
