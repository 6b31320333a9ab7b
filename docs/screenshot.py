"""Render the README's screenshot (docs/screenshot.svg) from the recorded box the snapshot
tests use, so the picture is reproducible: `make screenshot`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from samai.console import replay
from samai.console.app import SamaiApp

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "data" / "recorded_box.json"


async def main(out: Path) -> None:
    recording = replay.load(RECORDING)
    app = SamaiApp(replay.recorded_config(recording), poll=False, clock=lambda: recording["probe"]["time"])
    async with app.run_test(size=(150, 48)) as pilot:
        while app.screen is not app.box_screen:  # pushed
            await pilot.pause()
        await pilot.pause()  # and its panes mounted
        replay.show(app, recording)
        await pilot.pause()
        app.save_screenshot(out.name, str(out.parent))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshot.svg"))
