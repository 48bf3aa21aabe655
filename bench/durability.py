"""What ``durability_replicas=1`` costs a write, measured in one run on loopback.

    .venv/bin/python -m bench.durability            # 2,000 calls per kind and setting
    .venv/bin/python -m bench.durability --calls 500
    .venv/bin/python -m bench.durability --cluster  # on a 3-master/3-replica Redis Cluster

A private primary and one replica (both ``appendonly yes``, ``appendfsync always``: the
settings the store asks for; the replica writes its own AOF) on this machine. One client calls,
in rounds that alternate the settings on the same servers:

* ``save``: one compare-and-set on a task (one write script per call);
* ``commit_tasks`` of 100 tasks: one script call for the batch (the runtime's group commit),
  reported per task;

with ``durability_replicas=0`` (the default: the primary's reply is the acknowledgement) and
``1`` (EVALSHA + PUBLISH + ``WAIT 1`` in one round trip: the reply waits for the replica). It
prints the median µs per call, the difference, and the ratio N=1 / N=0. Then the same with the
AOF off on both servers (a tuned figure: no fsync in either path), and what ``get`` (a read,
never followed by ``WAIT``) costs for comparison. No assertions: docs/reliability.md records.

``--cluster``: the same calls on a Redis Cluster of three masters with a replica each
(``chongming_redis/embedded/redis_cluster.py``, every node ``appendfsync always``), the store opened
with ``cluster=True``: with N=1 each write goes as EVALSHA + ``SET {ns}:wait`` + ``WAIT 1`` in one
pipeline on a connection of the namespace's slot master (both namespaces in one slot, so on one
master); then with the AOF switched off on every node (``CONFIG SET``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

from rich.console import Console
from rich.table import Table

from chongming_redis import TaskSnapshot, TaskStatus
from chongming_redis.embedded.redis_server import LOOPBACK, EmbeddedRedis
from chongming_redis.stores.redis import RedisTaskStore

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BATCH = 100
ROUNDS = 5


def task(task_id: str, version: int = 1) -> TaskSnapshot:
    return TaskSnapshot(task_id, "thumbnails.resize", TaskStatus.PENDING, version, T0, T0,
                        tags=frozenset({"images"}), params={"width": 640})  # fmt: skip


def start_pair(aof: bool) -> tuple[EmbeddedRedis, EmbeddedRedis]:
    # The replica's first copy at once (Redis 7 waits 5 s for more replicas to share it).
    settings = ("--repl-diskless-sync-delay", "0", *(() if aof else ("--appendonly", "no")))
    primary = EmbeddedRedis(port=0, extra_args=settings).start()
    replica = EmbeddedRedis(port=0, extra_args=(*settings, "--replicaof", LOOPBACK,
                                                str(primary.port))).start()  # fmt: skip
    with primary.client() as client:
        deadline = time.monotonic() + 30
        while client.wait(1, 100) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not come up")
    return primary, replica


class Chain:
    """Calls of one kind on one store; ``run(n)`` returns the µs per call (or per task)."""

    def __init__(self, store: RedisTaskStore, kind: str) -> None:
        self.store, self.kind, self.version, self.made = store, kind, 1, 0
        store.create(task(f"{kind}-chain"))

    def run(self, calls: int) -> float:
        step: Callable[[], object]
        if self.kind == "save":
            step = self.save
        elif self.kind == "get":
            step = lambda: self.store.get(f"{self.kind}-chain")  # noqa: E731
        else:
            step = self.commit
        began = time.perf_counter()
        for _ in range(calls):
            step()
        per = (time.perf_counter() - began) / calls * 1e6
        return per / BATCH if self.kind == "commit_tasks" else per

    def save(self) -> None:
        self.store.save(task(f"{self.kind}-chain", self.version + 1), expect_version=self.version)
        self.version += 1

    def commit(self) -> None:
        first = self.made
        self.made += BATCH
        self.store.commit_tasks([(task(f"c{i}"), None, []) for i in range(first, self.made)])


def measure(url: str, calls: int, cluster: bool = False) -> dict[tuple[str, int], float]:
    """Median µs per call for each (kind, durability_replicas), rounds alternating."""
    samples: dict[tuple[str, int], list[float]] = {}
    chains = {}
    for n, namespace in enumerate(namespaces(cluster)):
        store = RedisTaskStore.from_url(url, namespace=namespace, check_server=False,
                                        durability_replicas=n, cluster=cluster)  # fmt: skip
        store.drop_namespace()
        for kind in ("save", "commit_tasks", "get"):
            chains[kind, n] = Chain(store, kind)
            chains[kind, n].run(20)  # warm: scripts loaded, connection made
    for _ in range(ROUNDS):
        for key, chain in chains.items():
            count = max(1, calls // (BATCH // 5)) if key[0] == "commit_tasks" else calls
            samples.setdefault(key, []).append(chain.run(max(1, count // ROUNDS)))
    return {key: statistics.median(values) for key, values in samples.items()}


def namespaces(cluster: bool) -> tuple[str, str]:
    """The namespaces of N=0 and N=1; on a cluster both in one slot, so on one master."""
    if not cluster:
        return "bench-durability-0", "bench-durability-1"
    from redis.crc import key_slot

    from chongming_redis.embedded.redis_cluster import namespace_in

    first = "bench-durability-0"
    return first, namespace_in(key_slot(first.encode()), prefix="bench-durability-n1")


def report(console: Console, title: str, results: dict[tuple[str, int], float]) -> None:
    table = Table(title=title)
    for column in ("call", "N=0 µs", "N=1 µs", "added µs", "N=1 / N=0"):
        table.add_column(column, justify="right")
    for kind, unit in (("save", "per call"), ("commit_tasks", "per task, 100 a call"),
                       ("get", "per call (a read: no WAIT)")):  # fmt: skip
        zero, one = results[kind, 0], results[kind, 1]
        table.add_row(f"{kind} ({unit})", f"{zero:.1f}", f"{one:.1f}", f"{one - zero:+.1f}",
                      f"{one / zero:.2f}")  # fmt: skip
    console.print(table)


def on_cluster(console: Console, calls: int) -> None:
    """The same rounds on a Redis Cluster (``--cluster``), AOF on, then off on every node."""
    from chongming_redis.embedded.redis_cluster import RedisClusterProcs

    cluster = RedisClusterProcs()
    try:
        for aof, title in ((True, "defaults: appendfsync always on every node"),
                           (False, "tuned: AOF off on every node")):  # fmt: skip
            for port in cluster.ports:
                with cluster.client(port) as node:
                    node.config_set("appendonly", "yes" if aof else "no")
            cluster.wait_stable()
            results = measure(cluster.url, calls, cluster=True)
            report(console, f"durability_replicas=1 vs 0 on Redis Cluster, 3 masters with a "
                   f"replica each ({title})", results)  # fmt: skip
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per kind and setting")
    parser.add_argument("--cluster", action="store_true", help="on a Redis Cluster instead")
    args = parser.parse_args()
    console = Console()
    if args.cluster:
        on_cluster(console, args.calls)
        return
    for aof, title in ((True, "defaults: appendfsync always on both"),
                       (False, "tuned: AOF off on both")):  # fmt: skip
        primary, replica = start_pair(aof)
        try:
            report(console, f"durability_replicas=1 vs 0, one replica on loopback ({title})",
                   measure(primary.url, args.calls))  # fmt: skip
        finally:
            replica.stop()
            primary.stop()


if __name__ == "__main__":
    main()
