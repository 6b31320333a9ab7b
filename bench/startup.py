"""Start-up to the first painted screen: the TUI in a pseudo-terminal against `import textual`.

    python bench/startup.py [--runs 5]

Both are measured in this one run, interleaved, each in a fresh interpreter, with bytecode
caches as an installed package has them (kept in a temporary PYTHONPYCACHEPREFIX, filled by a
first, unmeasured run of each):

  import textual  `python -c "import textual"`, from start to exit;
  textual hello   the smallest Textual app that paints what is waited for below (a Static
                  titled " alerts " and a Footer with a q binding), in the same pseudo-terminal
                  and environment, timed the same way: what any Textual app pays before its first
                  paint, and so the floor under the console's figure;
  console         `python -m samai.console`: the TUI with the default local target and the
                  built-in tiny pipeline, in a pseudo-terminal of 150x45 (its controlling
                  terminal, TERM=xterm-256color), HOME and the XDG folders in a fresh temporary
                  folder (so are its workspace, state and preferences), from start until the
                  main screen is painted: the title of the bottom-right pane (" alerts ") and
                  the footer's keys ("Quit"; Textual's own Footer adds them a frame after the
                  panes) have been written to the terminal. Then it is told to quit (q) and killed if it does not.

Printed: median and max of both, and the ratio of the medians. Target from the issue:
console <= 2 x import textual (issue 36), median of 10. This is a measurement, not a test:
nothing asserts on timings.
"""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time

from harness import Timings, argument_parser, print_figure

SIZE = (150, 45)
PAINTED = (b" alerts ", b"Quit")  # the last pane's title, and a key of the footer


def bytecode_env(pycache: str) -> dict[str, str]:
    """This environment with bytecode written to and read from pycache (never into the repository)."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def isolated_env(root: str, pycache: str) -> dict[str, str]:
    """The console's environment: HOME and the XDG folders under root, so nothing is written elsewhere."""
    env = dict(bytecode_env(pycache), HOME=root, TERM="xterm-256color", COLUMNS=str(SIZE[0]), LINES=str(SIZE[1]))
    for name in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        env[name] = os.path.join(root, name.lower())
    env.pop("TEXTUAL", None)  # no devtools
    return env


def _take_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Tui:
    """The console on a pseudo-terminal whose output is read (and kept) as it comes."""

    def __init__(self, argv: list[str], root: str, pycache: str) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=isolated_env(root, pycache),
                                     cwd=root, preexec_fn=_take_terminal, close_fds=True)
        os.close(slave)
        self.output = bytearray()

    def read(self, timeout: float) -> bool:
        """Read what is there (waiting up to timeout); False once the terminal is closed."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 1 << 16)
        except OSError:  # EIO: the other side is gone
            return False
        self.output += data
        return bool(data)

    def wait_painted(self, timeout: float = 30.0) -> float:
        """Seconds from the start until every string of PAINTED has been written."""
        deadline = time.monotonic() + timeout
        while not all(s in self.output for s in PAINTED):
            if time.monotonic() > deadline or not self.read(0.5):
                tail = bytes(self.output[-1500:]).decode("utf-8", "replace")
                raise RuntimeError(f"no first paint (rc={self.proc.poll()}); the terminal's last output:\n{tail}")
        return time.perf_counter() - self.started

    def drain(self, seconds: float) -> None:
        """Keep reading for that long, so that the console never blocks on a full terminal."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if not self.read(min(left, 0.5)):
                time.sleep(min(left, 0.1))

    def close(self) -> None:
        """Quit with q (the console ends its probe), else kill the whole session."""
        try:
            os.write(self.master, b"q")
            end = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < end:
                self.read(0.1)
        except OSError:
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        os.close(self.master)


HELLO = """
from textual.app import App
from textual.widgets import Footer, Static


class Hello(App):
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self):
        pane = Static("hello")
        pane.border_title = "alerts"
        pane.styles.border = ("round", "white")
        yield pane
        yield Footer()


Hello().run()
"""


def import_textual(pycache: str) -> None:
    subprocess.run([sys.executable, "-c", "import textual"], check=True, env=bytecode_env(pycache))


def time_console(pycache: str, argv: tuple[str, ...] = ("-m", "samai.console")) -> float:
    root = tempfile.mkdtemp(prefix="samai-bench-startup-")
    try:
        tui = Tui([sys.executable, *argv], root, pycache)
        try:
            return tui.wait_painted()
        finally:
            tui.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(runs: int) -> None:
    times = Timings()
    with tempfile.TemporaryDirectory(prefix="samai-bench-pycache-") as pycache:
        hello = ("-c", HELLO)
        import_textual(pycache), time_console(pycache), time_console(pycache, hello)  # fill the caches
        for _ in range(runs):
            times.time("import textual", import_textual, pycache)
            times.add("textual hello", time_console(pycache, hello))
            times.add("console", time_console(pycache))  # to the first paint: the TUI times itself
    print(f"start-up to the first painted screen, {runs} runs each, interleaved "
          f"({os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {SIZE[0]}x{SIZE[1]} pty)")
    print(f"{'':<15} {'median ms':>10} {'max ms':>10}")
    for name in ("import textual", "textual hello", "console"):
        print(f"{name:<15} {1000 * times.median(name):>10.0f} {1000 * times.percentile(name, 1.0):>10.0f}")
    print_figure("console / import textual", times.median("console"), times.median("import textual"), at_most=2)
    print_figure("textual hello / import textual", times.median("textual hello"), times.median("import textual"))
    print_figure("console / textual hello", times.median("console"), times.median("textual hello"))


if __name__ == "__main__":
    main(argument_parser(__doc__, runs=10).parse_args().runs)
