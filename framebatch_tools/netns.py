"""Hosts for tests and benchmarks, built from Linux network namespaces: each host is a
namespace with one veth link to a switch (a bridge in a namespace of its own), so processes on
different hosts talk over a real, separate network stack and a host's link can be taken
down.  Nothing touches the machine's own namespace; everything is removed on exit.  Needs
root and iproute2 (``ip netns``)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000


def netns_available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "iproute2 (ip) is not installed"
    probe = f"fbprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return False, f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Hosts:
    """``names`` become hosts ``10.213.0.1``, ``.2``, ... in that order."""

    names: Sequence[str]
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    addresses: dict[str, str] = field(default_factory=dict)

    def _ns(self, name: str) -> str:
        return f"fb{self.tag}-{name}"

    def _switch_port(self, name: str) -> str:
        return f"fb{self.tag}{self.names.index(name)}s"  # 15 characters at most

    def __enter__(self) -> Hosts:
        switch = self._ns("switch")
        ip("netns", "add", switch)
        ip("-n", switch, "link", "add", "br0", "type", "bridge")
        ip("-n", switch, "link", "set", "br0", "up")
        for index, name in enumerate(self.names, start=1):
            ns, port, inner = self._ns(name), self._switch_port(name), f"fb{self.tag}{index}h"
            ip("netns", "add", ns)
            ip(
                "link",
                "add",
                inner,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                switch,
            )
            ip("-n", switch, "link", "set", port, "master", "br0", "up")
            ip("-n", ns, "link", "set", inner, "name", "eth0")
            address = f"{SUBNET}.{index}"
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            self.addresses[name] = address
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name in [*self.names, "switch"]:
            subprocess.run(["ip", "netns", "del", self._ns(name)], capture_output=True)

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``host`` (its network; the same files and processes)."""
        return ["ip", "netns", "exec", self._ns(host), *argv]

    def link(self, host: str, up: bool) -> None:
        """Plug or unplug the host's cable (at the switch: the host notices nothing)."""
        ip("-n", self._ns("switch"), "link", "set", self._switch_port(host), "up" if up else "down")

    def enter(self, host: str) -> None:
        """Move this thread onto ``host``'s network (``setns``): what it starts later, threads
        and processes, is there too.  For a driver that must reach servers bound on a host
        (a Redis Cluster announces the address it was met on)."""
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/run/netns/{self._ns(host)}") as handle:
            if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"setns onto host {host}: {os.strerror(error)}")
