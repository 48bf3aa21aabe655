"""One worker process of ``bench.store_throughput`` (``python -m bench.store_worker``), and
``Pool``, the driver's handle on a few of them.

The worker takes the CLI worker's path on any store: ``open_store`` (as ``chongming-redis
worker --store URL`` opens it), ``ControllerConfig()``'s defaults with ``polling_for`` the
store (0.2 s polls where there are no nudges), the default retry policy, 64 buckets,
``join_pool`` with the CLI's 5 s lease. Before the clock starts it settles the bucket pool
(every bucket owned, shares within one), says ``{"ready": owner}`` on stdout and waits for
``go`` on stdin; then it runs until ``stop`` (or the end of stdin) and says ``{"cpu": s}``,
its process CPU from the release to the stop.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from chongming_redis.cli.common import open_store
from chongming_redis.cli.worker import polling_for
from chongming_redis.policy import RetryPolicy
from chongming_redis.runtime.app import App
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.pool import BucketPool
from chongming_redis.testing.processes import Worker

ROOT = Path(__file__).resolve().parents[1]
NUM_BUCKETS = 64  # the CLI's --num-buckets default
WORKER_LEASE = 5.0  # the CLI's --worker-lease default

app = App("bench-stores")


@app.task()
def noop(ctx: TaskContext, params: Any) -> None:
    return None


# -- the worker process -------------------------------------------------------------------------


def open_worker_store(url: str, namespace: str, synchronous: str | None) -> Any:
    """The store as the CLI worker opens it; ``synchronous``: a SQLite file with that setting
    (a tuned run beside the default; a URL cannot say it)."""
    if synchronous is not None:
        from chongming_redis.stores.sqlite import SqliteTaskStore

        return SqliteTaskStore(url.removeprefix("sqlite://"), synchronous=synchronous)
    return open_store(None, namespace, store_url=url, check_server=False, create=True)


def open_polling_store(url: str, namespace: str) -> Any:
    """The store as before issue 30, for the figures beside the new ones: PostgreSQL without
    ``LISTEN``/``NOTIFY`` (``nudges=False``), no quicker poll after work was found (SQLite)."""
    from chongming_redis.runtime import loops

    loops.BUSY_FOR = 0.0  # BusyPoll reads it when the controller starts
    if url.startswith("postgresql://"):
        from chongming_redis.stores.postgres import PostgresTaskStore

        return PostgresTaskStore(url, schema=namespace, nudges=False)
    return open_worker_store(url, namespace, None)


def settle(pool: BucketPool, store: Any, workers: int, timeout: float = 30.0) -> None:
    """Tick until the pool's ``workers`` share every bucket within one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pool.tick()
        _, owners = store.pool_state()
        shares = Counter(owners.values())
        balanced = bool(shares) and max(shares.values()) - min(shares.values()) <= 1
        if len(owners) == NUM_BUCKETS and len(shares) == workers and balanced:
            return
        time.sleep(0.05)


def say(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.store_worker")
    parser.add_argument("--store", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--workers", type=int, required=True, help="pool size to wait for")
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"))
    parser.add_argument("--no-nudges", action="store_true",
                        help="poll as before issue 30: no NOTIFY, no busy poll")  # fmt: skip
    options = parser.parse_args(argv)
    if options.no_nudges:
        store = open_polling_store(options.store, options.namespace)
    else:
        store = open_worker_store(options.store, options.namespace, options.synchronous)
    config = polling_for(store, ControllerConfig())
    controller = Controller(store, app=app, owner=options.owner, config=config,
                            retry=RetryPolicy(), buckets=BucketPolicy(NUM_BUCKETS))  # fmt: skip
    settle(controller.join_pool(worker_lease=WORKER_LEASE), store, options.workers)
    say({"ready": options.owner})
    if sys.stdin.readline().strip() != "go":
        return
    cpu = time.process_time()
    controller.start()
    sys.stdin.readline()  # "stop", or the driver is gone
    say({"cpu": time.process_time() - cpu})
    controller.shutdown(grace=5)
    store.close()


# -- the driver's handle ------------------------------------------------------------------------


class Pool:
    """``count`` worker processes on one store, started and settled on ``with``, released
    together, stopped by ``stop()``; any still running at the end are killed (by pid)."""

    def __init__(
        self, url: str, namespace: str, count: int, tmp: Path, extra: Sequence[str] = ()
    ) -> None:
        self.args = [f"--store={url}", f"--namespace={namespace}", f"--workers={count}", *extra]
        self.names = [f"{namespace}-{i}" for i in range(count)]
        self.tmp = tmp
        self.workers: list[Worker] = []
        self.cpu: float | None = None

    def __enter__(self) -> Pool:
        for name in self.names:
            stderr_path = self.tmp / f"{name}.stderr"
            with stderr_path.open("wb") as stderr:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "bench.store_worker", f"--owner={name}", *self.args],
                    cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                    bufsize=0,
                )  # fmt: skip
            self.workers.append(Worker(proc, name, stderr_path))
        for worker in self.workers:
            worker.read_json(timeout=60)  # {"ready": name}
        return self

    def release(self) -> None:
        for worker in self.workers:
            worker.send("go")

    def stop(self) -> float:
        """Stop every worker; their summed CPU seconds since the release."""
        if self.cpu is None:
            for worker in self.workers:
                worker.send("stop")
            self.cpu = sum(float(w.read_json(timeout=30)["cpu"]) for w in self.workers)
            for worker in self.workers:
                worker.proc.wait(30)
        return self.cpu

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait(10)
            for pipe in (worker.proc.stdin, worker.proc.stdout):
                if pipe is not None:
                    with suppress(BrokenPipeError):
                        pipe.close()


if __name__ == "__main__":
    main()
