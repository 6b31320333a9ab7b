"""A real OpenSSH server on a free loopback port, for the SSH tests and the SSH benchmark.

It gets its own host key, a client key for root and for a non-root user, and a HOME for the
client side with known_hosts and an ssh config (a Host alias), so that the console under
test finds everything where an operator's would be."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
TEST_USER = "samaitest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (path.with_suffix(".pub") if path.suffix else Path(f"{path}.pub")).read_text().strip()


def ensure_user(name: str = TEST_USER) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        # "*": no password to log in with, yet not locked ("!"), which sshd would refuse.
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*", name], check=True)
        return pwd.getpwnam(name)


@dataclass
class SshServer:
    root: Path  # everything of this server lives here; every folder above it must be world-searchable
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def client_home(self) -> Path:
        return self.root / "home"

    @property
    def alias(self) -> str:
        return "samai-box"

    def start(self) -> SshServer:
        ensure_user()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # sshd reads a user's authorized keys as that user
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        keys = self.root / "keys"
        keys.mkdir(parents=True)
        keys.chmod(0o755)
        keygen(keys / "host")
        dot_ssh = self.client_home / ".ssh"
        dot_ssh.mkdir(parents=True)
        client_pub = keygen(dot_ssh / "id_ed25519")
        authorized = self.root / "authorized"
        authorized.mkdir(mode=0o755)
        for user in ("root", TEST_USER):
            (authorized / user).write_text(client_pub + "\n")
            (authorized / user).chmod(0o644)
        self.write_known_hosts((keys / "host.pub").read_text())
        (dot_ssh / "config").write_text(
            f"Host {self.alias}\n  HostName 127.0.0.1\n  Port {self.port}\n  User root\n"
            f"  IdentityFile {dot_ssh / 'id_ed25519'}\n  UserKnownHostsFile {dot_ssh / 'known_hosts'}\n"
            f"  BatchMode yes\n")
        config = self.root / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {keys / 'host'}",
            f"PidFile {self.root / 'sshd.pid'}", f"AuthorizedKeysFile {authorized}/%u", "StrictModes no",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "PermitRootLogin prohibit-password", "MaxSessions 30", "MaxStartups 50", "LogLevel ERROR",
        ]) + "\n")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
        self.wait_ready()
        return self

    def write_known_hosts(self, host_pub: str) -> None:
        kind, key = host_pub.split()[:2]
        (self.client_home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {kind} {key}\n")

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not come up on port {self.port}")

    def session_processes(self) -> list[int]:
        """The per-connection sshd processes (children of the listener): killing them cuts
        every open connection while the server keeps listening."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def cut_connections(self) -> None:
        for pid in self.session_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def ssh_argv(self) -> list[str]:
        """The OpenSSH client aimed at this server (it reads the config of the passwd home,
        not $HOME, so the test config is named explicitly)."""
        return ["ssh", "-F", str(self.client_home / ".ssh" / "config"), self.alias]

    def url(self, user: str = "root") -> str:
        return f"ssh://{user}@127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.cut_connections()
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def new_root() -> Path:
    """A folder for a server outside pytest's private (0700) temp tree."""
    return Path(tempfile.mkdtemp(prefix="samai-sshd-"))


def available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None and os.geteuid() == 0
