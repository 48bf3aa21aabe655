"""kill -9 of PostgreSQL in the middle of a run of writes (RELIABILITY F1/F4 on the SQL side):
four writers, each with its own ``PostgresTaskStore`` (its own pool), create and save tasks,
append their history and submit commands while the server's every process is SIGKILLed, stays
down a while, and is restarted on the same data directory and port.

It proves that:

* every write acknowledged before the kill is there after the restart, exactly as written;
* nothing is duplicated: one row per task, per history version, per command, and the change
  feed lists each task once, at one position;
* a call while the server is down raises ``StoreUnavailable`` — never another error, never a
  "conflict" or "already exists" for a write of the caller's own whose reply was lost — and no
  call is acknowledged by a dead server;
* the stores recover by themselves once the server is back: every writer is acknowledged again
  with no action (the pools replace their dead connections).

A write whose call raised ``StoreUnavailable`` may or may not have landed: the writer reads it
back before it goes on (as the runtime does), and the check accepts either fate for it, all or
nothing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import pytest

from chongming_redis import (
    Command,
    CommandKind,
    StoreUnavailable,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.stores.postgres import PostgresTaskStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WRITERS = 4
SCHEMA = "faults"
#: Acknowledged ops each writer reaches before the kill, and again after the restart.
BEFORE, AFTER = 40, 40
STATUSES = (TaskStatus.RUNNING, TaskStatus.PAUSED, TaskStatus.RUNNING, TaskStatus.SUCCEEDED)


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Op:
    op: str
    key: str  # a task id or a command id
    version: int
    t0: float
    t1: float = 0.0
    outcome: str = ""  # "ok", "unavailable", or the name of any other exception
    detail: str = ""


@dataclass
class Writer:
    """One writer's own tasks and commands, and every op it made with its outcome."""

    name: str
    store: PostgresTaskStore
    ops: list[Op] = field(default_factory=list)
    tasks: dict[str, TaskSnapshot] = field(default_factory=dict)  # acknowledged (or resolved)
    unsure: dict[str, TaskSnapshot] = field(default_factory=dict)  # sent, outcome unknown
    history: dict[tuple[str, int], Transition] = field(default_factory=dict)  # acked appends
    to_append: list[Transition] = field(default_factory=list)
    commands: set[str] = field(default_factory=set)  # acked (or resolved) submits
    unsure_commands: set[str] = field(default_factory=set)
    created: int = 0
    fates: Counter[str] = field(default_factory=Counter)  # of the writes of unknown outcome

    def ok_count(self, after: float = 0.0) -> int:
        return sum(1 for o in self.ops if o.outcome == "ok" and o.t0 > after)

    def unavailable_after(self, moment: float) -> int:
        return sum(1 for o in self.ops if o.outcome == "unavailable" and o.t0 > moment)

    def call(self, op: str, key: str, version: int, fn: Any) -> bool:
        record = Op(op, key, version, time.monotonic())
        self.ops.append(record)
        try:
            fn()
            record.outcome = "ok"
        except StoreUnavailable as exc:
            record.outcome, record.detail = "unavailable", str(exc)
        except Exception as exc:  # recorded, and the check fails on it
            record.outcome, record.detail = type(exc).__name__, str(exc)
        record.t1 = time.monotonic()
        return record.outcome == "ok"

    # -- one step ------------------------------------------------------------------------

    def step(self, n: int) -> None:
        if self.unsure or self.unsure_commands:
            self.resolve()
        elif self.to_append and n % 3 == 0:
            entry = self.to_append[0]
            if self.call("append", entry.task_id, entry.version, lambda: self.store.append(entry)):
                self.history[(entry.task_id, entry.version)] = self.to_append.pop(0)
        elif n % 5 == 0:
            self.submit(n)
        elif len(self.tasks) < 3 or n % 4 == 0:
            self.create()
        else:
            self.save(sorted(self.tasks)[n % len(self.tasks)])

    def create(self) -> None:
        self.created += 1
        now = _now()
        task = TaskSnapshot(
            task_id=f"{self.name}-t{self.created}",
            name=f"job-{self.name}",
            status=TaskStatus.PENDING,
            status_version=1,
            created_at=now,
            updated_at=now,
            tags=frozenset({self.name}),
            bucket=self.created % 4,
            params={"n": self.created},
        )
        if self.call("create", task.task_id, 1, lambda: self.store.create(task)):
            self.landed(task, None)
        elif self.ops[-1].outcome == "unavailable":
            self.unsure[task.task_id] = task

    def save(self, task_id: str) -> None:
        old = self.tasks[task_id]
        if old.status.is_terminal:
            return
        version = old.status_version + 1
        task = replace(
            old,
            status=STATUSES[version % len(STATUSES)],
            status_version=version,
            updated_at=_now(),
            result={"v": version},
            tags=frozenset({self.name, f"v{version}"}),
        )
        save = lambda: self.store.save(task, expect_version=old.status_version)  # noqa: E731
        if self.call("save", task_id, version, save):
            self.landed(task, old)
        elif self.ops[-1].outcome == "unavailable":
            self.unsure[task_id] = task

    def submit(self, n: int) -> None:
        command = Command(f"{self.name}-c{n}", f"{self.name}-t1", CommandKind.STOP, _now())
        if self.call("submit", command.command_id, 0, lambda: self.store.submit_command(command)):
            self.commands.add(command.command_id)
        elif self.ops[-1].outcome == "unavailable":
            self.unsure_commands.add(command.command_id)

    def landed(self, task: TaskSnapshot, old: TaskSnapshot | None) -> None:
        self.tasks[task.task_id] = task
        came_from = None if old is None else old.status
        self.to_append.append(
            Transition(task.task_id, task.status_version, came_from, task.status, task.updated_at)
        )

    def resolve(self) -> None:
        """Read back what an unavailable call sent: landed, or to be sent again."""
        for task_id, sent in list(self.unsure.items()):
            found: list[TaskSnapshot | None] = []
            read = lambda i=task_id, into=found: into.append(self.store.get(i))  # noqa: E731
            if not self.call("get", task_id, 0, read):
                return  # still down
            del self.unsure[task_id]
            stored = found[0]
            if stored is not None and stored.status_version == sent.status_version:
                self.landed(sent, self.tasks.get(task_id))  # the lost reply's write landed
                self.fates["landed"] += 1
            else:
                self.fates["not written"] += 1
        for command_id in list(self.unsure_commands):
            got: list[Command | None] = []
            ask = lambda i=command_id, into=got: into.append(self.store.get_command(i))  # noqa: E731
            if not self.call("get_command", command_id, 0, ask):
                return
            self.unsure_commands.discard(command_id)
            self.fates["landed" if got[0] is not None else "not written"] += 1
            if got[0] is not None:
                self.commands.add(command_id)


def run_writer(writer: Writer, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        writer.step(n)
        if writer.ops and writer.ops[-1].outcome == "unavailable":
            time.sleep(0.02)  # the store already waited for a connection; do not spin


def wait_until(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.02)


def test_kill9_of_postgres_mid_run_loses_no_acknowledged_write(
    fresh_postgres_proc: PostgresProc,
) -> None:
    server = fresh_postgres_proc
    PostgresTaskStore(server.dsn, schema=SCHEMA).close()  # the schema exists before the load
    writers = [
        Writer(f"w{i}", PostgresTaskStore(server.dsn, schema=SCHEMA, max_size=2, timeout=1.0))
        for i in range(WRITERS)
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=run_writer, args=(w, stop)) for w in writers]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: all(w.ok_count() >= BEFORE for w in writers), "load before the kill")
        kill_started = time.monotonic()
        server.kill9()
        kill_done = time.monotonic()
        wait_until(
            lambda: all(w.unavailable_after(kill_done) >= 2 for w in writers),
            "every writer told StoreUnavailable while the server is down",
        )
        restart_started = time.monotonic()
        server.restart()
        restarted = time.monotonic()
        wait_until(
            lambda: all(w.ok_count(after=restarted) >= AFTER for w in writers),
            "every writer acknowledged again after the restart, with no action",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        for w in writers:
            w.store.close()

    ops = [o for w in writers for o in w.ops]
    # Never a wrong answer: every call was acknowledged or raised StoreUnavailable.
    wrong = [o for o in ops if o.outcome not in ("ok", "unavailable")]
    assert not wrong, wrong[:5]
    # Nothing acknowledged by a dead server: an op that began after the kill and ended
    # before the restart began was refused.
    during = [o for o in ops if o.t0 > kill_done and o.t1 < restart_started]
    assert during and all(o.outcome == "unavailable" for o in during)
    # Every writer was acknowledged before the kill, and the kill interrupted the load.
    assert all(any(o.outcome == "ok" and o.t1 < kill_started for o in w.ops) for w in writers)

    check = PostgresTaskStore(server.dsn, schema=SCHEMA)
    try:
        report = check_durability(check, writers)
    finally:
        check.close()
    outcomes = Counter(o.outcome for o in ops)
    fates = sum((w.fates for w in writers), Counter[str]())
    first_ok = min(o.t1 for o in ops if o.outcome == "ok" and o.t0 > restarted) - restarted
    print(
        f"\n[kill -9 postgres] {WRITERS} writers, {len(ops)} calls {dict(outcomes)};"
        f" writes that raised StoreUnavailable, read back: {dict(fates)}; {report};"
        f" down {restart_started - kill_done:.2f}s, first acknowledgement"
        f" {first_ok:.2f}s after the restart"
    )


def check_durability(store: PostgresTaskStore, writers: list[Writer]) -> str:
    """Acknowledged ⊆ stored, exactly as written; stored ⊆ attempted; nothing twice."""
    stored = store.query()
    ids = [t.task_id for t in stored]
    assert len(ids) == len(set(ids)), "a task is listed twice"
    by_id = {t.task_id: t for t in stored}
    attempted: set[str] = set()
    for w in writers:
        attempted |= {o.key for o in w.ops if o.op == "create"}
        for task_id, task in w.tasks.items():
            got = by_id.get(task_id)
            if task_id in w.unsure:  # the last write's fate is open: either version is fine
                sent = w.unsure[task_id]
                assert got in (task, sent), (task_id, got)
            else:
                assert got == task, f"acknowledged state of {task_id} lost: {got} != {task}"
        for task_id, sent in w.unsure.items():
            if task_id not in w.tasks:  # an unresolved create: there entirely, or not at all
                assert by_id.get(task_id) in (None, sent), task_id
        for (task_id, version), entry in w.history.items():
            found = {h.version: h for h in store.history(task_id)}
            assert found.get(version) == entry, f"acknowledged append lost: {entry}"
        for command_id in w.commands:
            got_command = store.get_command(command_id)
            assert got_command is not None, f"acknowledged command lost: {command_id}"
    assert set(by_id) <= attempted, "a task nobody created"
    # Each history version once, in order (the primary key keeps it so; a retry adds nothing).
    for task_id in by_id:
        versions = [h.version for h in store.history(task_id)]
        assert versions == sorted(set(versions)), (task_id, versions)
    # The change feed lists every task once, in position order; counts agree with query.
    listed: list[str] = []
    cursor = "0"
    while True:
        page = store.changes(cursor, limit=256)
        if not page.tasks:
            break
        listed += [item.task_id for item in page.tasks]
        assert int(page.next_cursor) > int(cursor)
        cursor = page.next_cursor
    assert Counter(listed) == Counter(list(by_id)), "the feed lists a task twice or misses one"
    per_status = Counter(t.status for t in stored)
    assert store.counts() == {s: per_status.get(s, 0) for s in TaskStatus}
    for status in TaskStatus:
        found = store.query(TaskQuery(statuses=frozenset({status})))
        assert sorted(t.task_id for t in found) == sorted(
            t.task_id for t in stored if t.status is status
        )
    commands = sum(len(w.commands) for w in writers)
    entries = sum(len(w.history) for w in writers)
    return (
        f"{len(by_id)} tasks, {entries} acked appends, {commands} acked commands all there;"
        f" {sum(len(w.unsure) for w in writers)} writes of unknown fate at the end"
    )
