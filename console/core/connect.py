"""From a config to a Box on its target: the one place the console opens one."""

from __future__ import annotations

from samai.console.core.config import Config
from samai.remote.boxapi import Box
from samai.remote.targets import open_transport, scheme


def open_box(cfg: Config, *, readonly: bool = False) -> Box:
    """readonly: a Box that writes nothing on the box (see samai.remote.boxapi)."""
    t = cfg.target
    ssh = None
    if scheme(t.url) == "ssh":
        from samai.remote.ssh import SshOptions  # asyncssh: only for an ssh target (see samai.remote.targets)

        ssh = SshOptions(t.keepalive_interval, t.keepalive_count, t.connect_timeout, t.max_channels)
    return Box(open_transport(t.url, ssh, t.token_env), cfg.workspace, python=t.box_python, timeout=t.timeout,
               readonly=readonly)
