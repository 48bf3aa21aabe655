"""The failover proof's pieces: writer processes, the forced failover, and the checker.

``run_failover`` drives one run on a primary and its replica:

1. ``WRITERS`` writer processes (``tests/support/failover_writer.py``) grow CAS chains;
2. the replica is stopped (SIGSTOP; or cut off by ``partition``) for ``lag`` seconds while
   they go on writing, so it lags (RELIABILITY F14): without ``durability_replicas`` the
   primary keeps acknowledging writes the replica has not got; with it, those writes fail as
   ``StoreUnavailable``;
3. the primary is killed (SIGKILL), the replica resumed and promoted by ``promote`` (plain:
   ``REPLICAOF NO ONE`` and the writers' proxy pointed at it; Sentinel: Sentinel's own
   failover), and a fresh replica joins the new primary;
4. the writers go on for ``after`` seconds (proof that the store found the new primary and
   reloaded its scripts), then stop; every task is read from the new primary.

``check`` replays each writer's log: an acknowledged version that a later observation (a
conflict, a read, the final read) shows the store no longer holds is an acknowledged write
lost (the writer is its tasks' only writer, so their versions go back only by loss).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.support.replicated_redis import start_replica, wait_until

ROOT = Path(__file__).resolve().parents[2]
WRITERS = 3
TASKS_PER_WRITER = 8


@dataclass
class Outcome:
    """What one run's checker found."""

    acknowledged: int = 0
    lost: int = 0
    unknown: int = 0
    acknowledged_after_failover: int = 0
    #: ``(task, version)`` of some lost writes, for the failure message.
    examples: list[tuple[str, int]] = field(default_factory=list)
    failover_seconds: float = 0.0

    def line(self) -> str:
        return (f"{self.acknowledged} acknowledged, {self.lost} of them lost, {self.unknown} "
                f"unknown outcomes, {self.acknowledged_after_failover} acknowledged after the "
                f"failover ({self.failover_seconds:.1f} s from kill to promotion)")  # fmt: skip


class Writers:
    """``count`` writer processes on ``url``, each with its log in ``directory``."""

    def __init__(self, url: str, namespace: str, directory: Path, *, count: int = WRITERS,
                 durability_replicas: int = 0, payload: int = 4096) -> None:  # fmt: skip
        self.directory, self.stopfile = directory, directory / "stop"
        self.names = [f"w{i}" for i in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for name in self.names:
            command = [sys.executable, "-m", "tests.support.failover_writer", url, namespace,
                       name, str(self.log(name)), str(self.stopfile),
                       f"--tasks={TASKS_PER_WRITER}", f"--payload={payload}",
                       f"--durability-replicas={durability_replicas}"]  # fmt: skip
            with open(directory / f"{name}.stderr", "wb") as stderr:
                self.procs.append(subprocess.Popen(command, cwd=ROOT, stderr=stderr))

    def log(self, name: str) -> Path:
        return self.directory / f"{name}.jsonl"

    def events(self, name: str) -> list[dict[str, object]]:
        path = self.log(name)
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def acks(self) -> int:
        return sum(1 for n in self.names for e in self.events(n) if "ack" in e)

    def stop(self) -> None:
        self.stopfile.touch()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for name, proc in zip(self.names, self.procs):
            stderr = (self.directory / f"{name}.stderr").read_text(errors="replace")
            assert proc.returncode == 0, f"writer {name} exited {proc.returncode}: {stderr}"

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def tasks(self) -> list[str]:
        return [f"{n}-{i}" for n in self.names for i in range(TASKS_PER_WRITER)]


def check(writers: Writers, final: dict[str, int], promoted_at: float) -> Outcome:
    """Replay every writer's log against the versions the store holds at the end."""
    outcome = Outcome()
    for name in writers.names:
        chains = Chains(outcome)
        for event in writers.events(name):
            if "ack" in event:
                chains.acknowledged(str(event["ack"]), int(str(event["v"])))
                outcome.acknowledged_after_failover += float(str(event["t"])) > promoted_at
            elif "seen" in event:
                chains.observed(str(event["seen"]), int(str(event["v"])))
            elif "unknown" in event:
                outcome.unknown += 1
        for task in list(chains.acked):
            chains.observed(task, final.get(task, 0))
    return outcome


class Chains:
    """One writer's acknowledged versions per task, as its log is replayed."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.acked: dict[str, set[int]] = {}

    def acknowledged(self, task: str, version: int) -> None:
        self.acked.setdefault(task, set()).add(version)
        self.outcome.acknowledged += 1

    def observed(self, task: str, version: int) -> None:
        """The store holds ``version`` of ``task`` now: every acknowledged version above it
        is lost (counted once: the chain goes on from ``version``)."""
        gone = {v for v in self.acked.get(task, set()) if v > version}
        self.outcome.lost += len(gone)
        self.outcome.examples += [(task, v) for v in sorted(gone)][:3]
        self.acked[task] = self.acked.get(task, set()) - gone


def final_versions(url: str, namespace: str, tasks: list[str]) -> dict[str, int]:
    store = RedisTaskStore.from_url(url, namespace=namespace, check_server=False)
    try:
        return {t: s.status_version for t in tasks if (s := store.get(t)) is not None}
    finally:
        store.close()


def run_failover(
    primary: RedisProc,
    replica: RedisProc,
    writers_url: str,
    namespace: str,
    directory: Path,
    *,
    durability_replicas: int,
    promote: Callable[[], int],
    partition: Callable[[], None] | None = None,
    lag: float = 1.5,
    after: float = 1.0,
) -> tuple[Outcome, RedisProc]:
    """One run (module docstring); returns the checker's outcome and the fresh replica (the
    caller closes it). ``promote`` makes the replica the primary the writers reach and returns
    its port. ``partition``: how the replica is made to lag instead of SIGSTOP (e.g. its
    replication link's proxy blackholed: the stream is dropped, not held in socket buffers)."""
    writers = Writers(writers_url, namespace, directory, durability_replicas=durability_replicas)
    fresh: RedisProc | None = None
    try:
        wait_until("writers acknowledged writes", lambda: writers.acks() >= 3 * WRITERS, 30)
        time.sleep(0.5)
        (partition or replica.sigstop)()
        time.sleep(lag)
        primary.kill9()
        killed_at = time.monotonic()
        if partition is None:
            replica.sigcont()
        port = promote()
        failover_seconds = time.monotonic() - killed_at
        promoted_at = time.time()
        fresh = start_replica(port)
        acked = writers.acks()
        wait_until("writes acknowledged after the failover",
                   lambda: writers.acks() > acked + WRITERS, 30)  # fmt: skip
        time.sleep(after)
        writers.stop()
    except BaseException:
        writers.kill()
        if fresh is not None:
            fresh.close()
        raise
    url = f"redis://127.0.0.1:{port}/0"
    outcome = check(writers, final_versions(url, namespace, writers.tasks()), promoted_at)
    outcome.failover_seconds = failover_seconds
    return outcome, fresh
