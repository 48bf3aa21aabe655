"""A real Redis Cluster for tests and benchmarks: three masters and three replicas on loopback.

Six ``redis-server --cluster-enabled yes`` processes (the package's launcher, each in a
temporary directory of its own, with AOF and ``appendfsync always`` like every test server),
joined by ``redis-cli --cluster create ... --cluster-replicas 1``; ``start`` returns when every
node says ``cluster_state:ok``, every node knows the same slot owners and every replica's link
to its master is up. ``url`` names one master (a cluster client discovers the rest).

What the tests do to it: ``reshard`` runs ``redis-cli --cluster reshard`` for one slot (the
lowest of its master: redis-cli picks a source's lowest slots), ``move_slot`` migrates any slot
by the same steps done by hand (``SETSLOT IMPORTING``/``MIGRATING``, ``MIGRATE`` of the keys in
batches, ``SETSLOT NODE``), slowly if asked; ``failover`` promotes a master's replica
(``CLUSTER FAILOVER``: the old master becomes its replica).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import redis
from redis.crc import key_slot

from chongming_redis.embedded.redis_server import LOOPBACK, RedisProc, port_is_free, port_share

__all__ = ["ClusterNode", "RedisClusterProcs", "namespace_in", "redis_cli_path"]

#: ``cluster-node-timeout`` (ms): how long a silent node takes to count as failing.
NODE_TIMEOUT_MS = 2000


def redis_cli_path() -> str | None:
    return shutil.which("redis-cli")


@dataclass(frozen=True)
class ClusterNode:
    """One node as ``CLUSTER NODES`` shows it."""

    node_id: str
    port: int
    master: bool
    master_id: str | None
    slots: tuple[tuple[int, int], ...]

    def holds(self, slot: int) -> bool:
        return any(low <= slot <= high for low, high in self.slots)


class RedisClusterProcs:
    """Six servers, three masters with a replica each, already running and joined."""

    def __init__(self, *, masters: int = 3, replicas_per_master: int = 1) -> None:
        cli = redis_cli_path()
        if cli is None:
            raise RuntimeError("redis-cli is not on PATH (apt-get install -y redis-tools)")
        self.cli = cli
        count = masters * (1 + replicas_per_master)
        self.servers: list[RedisProc] = []
        try:
            for _ in range(count):
                self.servers.append(RedisProc(port=_cluster_port(), extra_args=_cluster_args()))
            addresses = [f"{LOOPBACK}:{s.port}" for s in self.servers]
            subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-replicas",
                 str(replicas_per_master), "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            self.wait_stable()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """A master's URL (any node would do: the cluster client discovers the others)."""
        return self.server(self.masters()[0].port).url

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.servers if s.port is not None]

    def server(self, port: int) -> RedisProc:
        return next(s for s in self.servers if s.port == port)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=port, socket_timeout=5)

    def nodes(self, port: int | None = None) -> list[ClusterNode]:
        """``CLUSTER NODES`` as one node (a master's by default) sees it."""
        with self.client(port or self.ports[0]) as c:
            return _parse_nodes(c.execute_command("CLUSTER NODES"))

    def masters(self) -> list[ClusterNode]:
        return sorted((n for n in self.nodes() if n.master), key=lambda n: n.port)

    def master_of(self, slot: int) -> ClusterNode:
        return next(n for n in self.nodes() if n.master and n.holds(slot))

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        return next(n for n in self.nodes() if n.master_id == master.node_id)

    def keyslot(self, key: str) -> int:
        with self.client(self.ports[0]) as c:
            return int(c.execute_command("CLUSTER KEYSLOT", key))

    # -- what the tests do to it -------------------------------------------------------------

    def move_slot(self, slot: int, to_port: int, *, batch: int = 10, pause: float = 0.0) -> int:
        """Migrate ``slot`` to the master on ``to_port``, the steps of ``redis-cli --cluster
        reshard`` (any one slot), ``batch`` keys per ``MIGRATE`` with ``pause`` seconds between
        them (a slow migration, for calls to meet it); returns how many keys moved."""
        source = self.master_of(slot)
        target = next(n for n in self.nodes() if n.port == to_port)
        assert target.master and target.node_id != source.node_id
        with self.client(source.port) as src, self.client(target.port) as dst:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.node_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.node_id)
            moved = 0
            while True:
                keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                src.execute_command("MIGRATE", LOOPBACK, target.port, "", 0, 10_000, "KEYS",
                                    *keys)  # fmt: skip
                moved += len(keys)
                time.sleep(pause)
            for node in (target, source):
                with self.client(node.port) as c:
                    c.execute_command("CLUSTER SETSLOT", slot, "NODE", target.node_id)
        self.wait_stable()
        return moved

    def reshard(self, slot: int, to_port: int, timeout: float = 120.0) -> str:
        """``redis-cli --cluster reshard`` of one slot to the master on ``to_port``; its
        output. redis-cli moves a source's lowest slots first, so ``slot`` must be the lowest
        its master holds (``lowest_slot``; ``namespace_in`` finds a namespace there)."""
        source = self.master_of(slot)
        target = next(n for n in self.nodes() if n.port == to_port)
        assert target.master and target.node_id != source.node_id
        assert min(low for low, _ in source.slots) == slot, "not the source's lowest slot"
        done = subprocess.run(
            [self.cli, "--cluster", "reshard", f"{LOOPBACK}:{source.port}",
             "--cluster-from", source.node_id, "--cluster-to", target.node_id,
             "--cluster-slots", "1", "--cluster-yes"],
            check=True, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        self.wait_stable()
        assert self.master_of(slot).port == to_port, done.stdout[-2000:]
        return done.stdout

    def lowest_slot(self, port: int) -> int:
        """The lowest slot the master on ``port`` holds."""
        node = next(n for n in self.nodes() if n.port == port)
        return min(low for low, _ in node.slots)

    def failover(self, master_port: int, timeout: float = 30.0) -> int:
        """``CLUSTER FAILOVER`` on the replica of the master on ``master_port``: the replica
        becomes the master of its slots, the old master its replica. Returns the new master's
        port once every node agrees."""
        master = next(n for n in self.nodes() if n.port == master_port)
        replica = self.replica_of(master)
        with self.client(replica.port) as c:
            c.execute_command("CLUSTER FAILOVER")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._is_master(replica.node_id, port) for port in self.ports):
                break
            time.sleep(0.05)
        else:
            raise TimeoutError(f"the replica on {replica.port} did not take over")
        self.wait_stable(timeout)
        return replica.port

    def _is_master(self, node_id: str, port: int) -> bool:
        return any(n.node_id == node_id and n.master for n in self.nodes(port))

    def wait_stable(self, timeout: float = 30.0) -> None:
        """Until every node says ``cluster_state:ok``, all agree on the slot owners and every
        replica's link to its master is up."""
        deadline = time.monotonic() + timeout
        problem = "not asked yet"
        while time.monotonic() < deadline:
            problem = self._instability()
            if not problem:
                return
            time.sleep(0.05)
        raise TimeoutError(f"the cluster did not settle in {timeout} s: {problem}")

    def _instability(self) -> str:
        views = set()
        for port in self.ports:
            with self.client(port) as c:
                info = c.execute_command("CLUSTER INFO")
                if info.get("cluster_state") != "ok":
                    return f"{port}: cluster_state is not ok"
                replication = c.info("replication")
                if replication.get("role") == "slave" and (
                    replication.get("master_link_status") != "up"
                ):
                    return f"{port}: replica link down"
            views.add(tuple(sorted((n.node_id, n.master, n.slots) for n in self.nodes(port))))
        if len(views) != 1:
            return "nodes disagree on the slot owners"
        return ""

    def close(self) -> None:
        for server in self.servers:
            server.close()
        self.servers.clear()


def namespace_in(slot: int, prefix: str = "ns") -> str:
    """A namespace whose keys (``{ns}:...``) hash to ``slot``: ``<prefix>-<n>`` for the first
    ``n`` that does (about 16384 tries on average, a fraction of a second)."""
    for n in range(2_000_000):
        namespace = f"{prefix}-{n}"
        if key_slot(namespace.encode()) == slot:
            return namespace
    raise RuntimeError(f"no namespace found for slot {slot}")


def _cluster_port() -> int:
    """A free loopback port whose cluster bus port (10000 above it) is free too: at most
    55535."""
    share, shares = port_share()  # the bus port (+10000) keeps the share for 2, 4, 5, 8 workers
    for _ in range(1000):
        port = random.randint(20000, 55535)
        if port % shares == share and all(port_is_free(p) for p in (port, port + 10000)):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _cluster_args() -> tuple[str, ...]:
    return ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS))  # fmt: skip


def _parse_nodes(parsed: dict[str, dict[str, Any]]) -> list[ClusterNode]:
    """redis-py's parsed ``CLUSTER NODES`` (address -> fields) as ``ClusterNode``s."""
    nodes = []
    for address, fields in parsed.items():
        port = int(address.split("@")[0].rsplit(":", 1)[1])
        # A range is [low, high], one slot alone [slot].
        slots = tuple((int(r[0]), int(r[-1])) for r in fields["slots"])
        master_id = None if fields["master_id"] == "-" else fields["master_id"]
        master = "master" in fields["flags"].split(",")
        nodes.append(ClusterNode(fields["node_id"], port, master, master_id, slots))
    return nodes
