"""A real Redis Cluster on loopback, for tests and benchmarks: three ``redis-server`` masters
with ``--cluster-enabled yes`` (each an :class:`EmbeddedRedis`, so it dies with its owner), the
16384 slots split among them, joined with CLUSTER MEET (what ``redis-cli --cluster create``
does, without its prompts)."""

from __future__ import annotations

import random
import socket
import time
from contextlib import ExitStack
from pathlib import Path
from tempfile import TemporaryDirectory

import redis
from redis.cluster import key_slot

from streams.embedded_redis import EmbeddedRedis

SLOTS = 16384
READY_TIMEOUT_S = 20.0


def _free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ports(host: str, count: int) -> list[int]:
    """Ports whose cluster bus port (+10000) is free too."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randrange(20000, 30000)
        if port not in chosen and _free(host, port) and _free(host, port + 10000):
            chosen.append(port)
    return chosen


class LocalRedisCluster:
    """Use as a context manager; ``url`` is the first node's, ``node_of(key)`` says which
    node holds a key."""

    def __init__(
        self,
        masters: int = 3,
        host: str = "127.0.0.1",
        extra_args: tuple[str, ...] = (),
        aof_dir: Path | None = None,
    ):
        """``host``: the address the nodes listen on and announce (a network-namespace
        host's, for benchmarks across hosts); ``extra_args``: more options for each node;
        ``aof_dir``: each node persists there (an append-only file fsynced on every write),
        so a node restarted comes back with its data."""
        self._masters = masters
        self.host = host
        self._extra_args = extra_args
        self._aof_dir = aof_dir
        self._stack = ExitStack()
        self._nodes: list[EmbeddedRedis] = []
        self.ports: list[int] = []
        self.url = ""

    def __enter__(self) -> LocalRedisCluster:
        try:
            # each node's cluster config outlives the node (restarts); its data does not
            self._config_dir = Path(self._stack.enter_context(TemporaryDirectory()))
            self.ports = _ports(self.host, self._masters)
            self._nodes = [self._node(port) for port in self.ports]
            for node in self._nodes:
                node.start()
                self._stack.callback(node.stop)
            self._join()
        except BaseException:
            self._stack.close()
            raise
        self.url = f"redis://{self.host}:{self.ports[0]}/0"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def _join(self) -> None:
        clients = [redis.Redis(self.host, p) for p in self.ports]
        bounds = [SLOTS * i // self._masters for i in range(self._masters + 1)]
        for i, client in enumerate(clients):
            client.execute_command("CLUSTER ADDSLOTSRANGE", bounds[i], bounds[i + 1] - 1)
            if i:
                client.execute_command("CLUSTER MEET", self.host, self.ports[0])
            client.close()
        self._wait_ok()

    def _wait_ok(self) -> None:
        """Until every node sees every node and every slot served."""
        clients = [redis.Redis(self.host, p) for p in self.ports]
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                infos = [c.execute_command("CLUSTER INFO") for c in clients]
                if all(_field(info, "cluster_state") == "ok" for info in infos) and all(
                    _field(info, "cluster_known_nodes") == str(self._masters) for info in infos
                ):
                    return
                time.sleep(0.1)
        finally:
            for client in clients:
                client.close()
        raise RuntimeError(f"the cluster did not come up in {READY_TIMEOUT_S:.0f} s: {infos}")

    def _node(self, port: int) -> EmbeddedRedis:
        config = self._config_dir / f"nodes-{port}.conf"
        data = None
        if self._aof_dir is not None:
            data = self._aof_dir / f"node-{port}"
            data.mkdir(parents=True, exist_ok=True)
        return EmbeddedRedis(
            port=port,
            bind=self.host,
            aof_dir=data,
            extra_args=(
                *("--cluster-enabled", "yes", "--cluster-node-timeout", "2000"),
                *("--cluster-config-file", str(config)),
                *self._extra_args,
            ),
        )

    def stop_node(self, index: int) -> None:
        """Stop one master (its slots are down: the cluster refuses commands to them, and to
        every slot once the others have noticed)."""
        self._nodes[index].stop()

    def crash_node(self, index: int) -> None:
        """SIGKILL one master (a crash: no shutdown, no final write)."""
        self._nodes[index].crash()

    def start_node(self, index: int) -> None:
        """Start a stopped master again in its place in the cluster, with its data when the
        nodes persist (``aof_dir``), else empty."""
        self._nodes[index] = self._node(self.ports[index])
        self._nodes[index].start()
        self._stack.callback(self._nodes[index].stop)
        self._wait_ok()

    def refusals(self) -> dict[str, int]:
        """How often the nodes refused a command as sent to the wrong slot or node (CROSSSLOT,
        MOVED, ASK, from INFO errorstats), counted since they started."""
        counts: dict[str, int] = {}
        for port in self.ports:
            with redis.Redis(self.host, port) as client:
                for name, stat in client.info("errorstats").items():
                    kind = name.removeprefix("errorstat_")
                    if kind in ("CROSSSLOT", "MOVED", "ASK"):
                        counts[kind] = counts.get(kind, 0) + int(stat["count"])
        return counts

    def node_of(self, key: str) -> int:
        """Index of the node that holds ``key``'s slot."""
        slot = key_slot(key.encode())
        return next(i for i in range(self._masters) if slot < SLOTS * (i + 1) // self._masters)


def _field(info: object, name: str) -> str:
    if isinstance(info, dict):
        return str(info.get(name))
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    return ""
