"""A writer process for the failover proofs (``stress/test_failover.py``)::

    python -m tests.support.failover_writer URL NAMESPACE NAME LOG STOPFILE \
        [--tasks 8] [--payload 4096] [--durability-replicas N] [--wait-timeout 0.3]

It owns ``--tasks`` tasks (``<NAME>-<i>``) and grows one compare-and-set chain on each, round
robin: ``create`` at version 1, then ``save`` of the next version expecting the last. It is the
only writer of its tasks, so their versions can only go back if the store lost writes.

Its log (one JSON line per event, flushed) is the client history the checker reads:

* ``{"ack": task, "v": n}``: the store acknowledged version ``n`` (the call returned);
* ``{"seen": task, "v": n}``: the version the store holds now (a conflict's, or a read after
  an unknown outcome); ``0``: no such task;
* ``{"unknown": task, "v": n}``: the call for version ``n`` raised ``StoreUnavailable``.

It stops when ``STOPFILE`` exists (and after 120 s whatever happens).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from datetime import datetime, timezone
from typing import IO, Any

from chongming_redis.errors import ConcurrencyConflict, StoreUnavailable, TaskAlreadyExists
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.redis import RedisTaskStore

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
LIMIT = 120.0


class Writer:
    def __init__(self, store: RedisTaskStore, name: str, tasks: int, payload: int, log: IO[str]):
        self.store, self.log = store, log
        self.blob = os.urandom(payload // 2).hex()
        self.tasks = [f"{name}-{i}" for i in range(tasks)]
        #: The version each task holds as far as this writer knows (None: unknown, read it).
        self.known: dict[str, int | None] = dict.fromkeys(self.tasks, 0)

    def record(self, **event: Any) -> None:
        event["t"] = time.time()
        self.log.write(json.dumps(event) + "\n")
        self.log.flush()

    def step(self, task_id: str) -> None:
        known = self.known[task_id]
        if known is None:
            found = self.store.get(task_id)
            known = 0 if found is None else found.status_version
            self.record(seen=task_id, v=known)
            self.known[task_id] = known
        version = known + 1
        snapshot = TaskSnapshot(task_id, "chain", TaskStatus.RUNNING, version, T0, T0,
                                result={"v": version, "blob": self.blob})  # fmt: skip
        try:
            if known == 0:
                self.store.create(snapshot)
            else:
                self.store.save(snapshot, expect_version=known)
        except ConcurrencyConflict as exc:
            self.record(seen=task_id, v=exc.actual or 0)
            self.known[task_id] = exc.actual or 0
            return
        except (TaskAlreadyExists, StoreUnavailable) as exc:
            if isinstance(exc, StoreUnavailable):
                self.record(unknown=task_id, v=version)
            self.known[task_id] = None
            raise
        self.record(ack=task_id, v=version)
        self.known[task_id] = version


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "namespace", "name", "log", "stopfile"):
        parser.add_argument(name)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--payload", type=int, default=4096)
    parser.add_argument("--durability-replicas", type=int, default=0)
    parser.add_argument("--wait-timeout", type=float, default=0.3)
    args = parser.parse_args(argv)
    store = RedisTaskStore.from_url(
        args.url, namespace=args.namespace, socket_timeout=1.0, socket_connect_timeout=0.5,
        retries=1, check_server=False, durability_replicas=args.durability_replicas,
        durability_timeout=args.wait_timeout if args.durability_replicas else None,
    )  # fmt: skip
    ends = time.monotonic() + LIMIT
    with open(args.log, "w", encoding="utf-8") as log:
        writer = Writer(store, args.name, args.tasks, args.payload, log)
        writer.record(started=args.name)
        turn = 0
        while not os.path.exists(args.stopfile) and time.monotonic() < ends:
            task_id = writer.tasks[turn % len(writer.tasks)]
            turn += 1
            try:
                writer.step(task_id)
            except (StoreUnavailable, TaskAlreadyExists):
                time.sleep(random.uniform(0.01, 0.03))  # the store is away: no hot loop
        writer.record(stopped=args.name)
    store.close()


if __name__ == "__main__":
    main()
