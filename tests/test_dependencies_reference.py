"""Every store keeps dependencies as the in-memory reference does (issue 28): seeded random
programs of creates (plain tasks and WAITING children of random parents, 'stop' or 'run', some
with a retention), saves (ends, reruns, stops of waiting tasks, refused moves), commits of
several items (a child created or saved by one item and its parent ended by a later one, or
the other way round), prunes, expiries and release calls, run on the reference and on a real
Redis, SQLite and PostgreSQL store side by side. After every step each store must show what
the reference shows: each call's result or refusal, every task's status, version and history
(statuses and reasons), the counts and the release backlog. Some tasks hold one of two unique
ids, so a refused create or rerun (``UniqueTaken``) is compared too.

The contract (``testing/extensions/dependencies.py``) pins the rules one scenario at a time;
this finds the combinations nobody wrote down (it found a child created by one item of a
commit and released by a later one left WAITING on Redis)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.errors import StoreError
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from chongming_redis.testing.contract.support import at

W, P, R = TaskStatus.WAITING, TaskStatus.PENDING, TaskStatus.RUNNING
S, F, X = TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.STOPPED
SEEDS, STEPS = 20, 40
FAR = datetime(2035, 1, 1, tzinfo=timezone.utc)  # every retention has run out by then


@pytest.fixture(params=["redis", "sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """A factory of empty stores of one kind (a namespace, file or schema each); opening one
    closes the one before (a PostgreSQL server has only so many connections)."""
    opened: list[Any] = []

    def fresh() -> Any:
        close_all()
        name = uuid.uuid4().hex[:12]
        if request.param == "redis":
            url = request.getfixturevalue("redis_proc").url
            store: Any = RedisTaskStore.from_url(url, namespace=f"dr-{name}")
        elif request.param == "sqlite":
            store = SqliteTaskStore(tmp_path / f"{name}.sqlite3")
        else:
            dsn = request.getfixturevalue("postgres_proc").dsn
            store = PostgresTaskStore(dsn, schema=f"dr_{name}")
        opened.append(store)
        return store

    def close_all() -> None:
        while opened:
            store = opened.pop()
            if isinstance(store, PostgresTaskStore):
                store.drop_schema()
            store.close()

    yield fresh
    close_all()


def task(task_id: str, status: TaskStatus, n: int, **fields: Any) -> TaskSnapshot:
    return TaskSnapshot(task_id, "job", status, 1, at(n), updated_at=at(n), **fields)


def moved(current: TaskSnapshot, status: TaskStatus) -> TaskSnapshot:
    return current.evolve(status=status, status_version=current.status_version + 1)


def next_status(rng: random.Random, current: TaskSnapshot) -> TaskStatus:
    """A move a worker or an operator makes; now and then one the store must refuse."""
    if rng.random() < 0.1 and (current.status is W or current.parents):
        return P if current.status is W else W  # out of WAITING unreleased / back into it
    if current.status.is_terminal:
        return P  # a rerun
    if current.status is W:
        return X  # an operator's stop
    return rng.choice([S, F, X, R])


def shown(store: Any) -> dict[str, Any]:
    """What a user can see: every task's status, version and history, the counts, the
    backlog (history times are each store's clock, so they are left out)."""
    out: dict[str, Any] = {}
    for t in store.query():
        out[t.task_id] = (t.status, t.status_version, t.parents, t.on_parent_failure)
        out[t.task_id + " history"] = [
            (e.version, e.from_status, e.to_status, e.reason) for e in store.history(t.task_id)
        ]
    out["counts"] = {status: n for status, n in store.counts().items() if n}
    out["backlog"] = store.release_backlog()
    return out


class Program:
    """One seeded random program; ``step`` draws the next operation against the reference."""

    def __init__(self, seed: int, reference: InMemoryTaskStore) -> None:
        self.rng, self.ref, self.n = random.Random(seed), reference, 0

    def new_id(self) -> str:
        self.n += 1
        return f"t{self.n}"

    def extra(self) -> dict[str, Any]:
        """A retention now and then, a unique id from a small pool now and then."""
        fields: dict[str, Any] = {"retention": 1.0} if self.rng.random() < 0.3 else {}
        if self.rng.random() < 0.2:
            fields["unique"] = self.rng.choice(["u1", "u2"])
        return fields

    def plain(self) -> TaskSnapshot:
        return task(self.new_id(), self.rng.choice([P, R]), self.n, **self.extra())

    def child(self, known: list[str]) -> TaskSnapshot:
        parents = self.rng.sample(known, min(len(known), self.rng.randint(1, 3)))
        if self.rng.random() < 0.05:
            parents.append("gone")  # refused: ParentNotFound
        policy = self.rng.choice(["stop", "run"])
        return task(self.new_id(), W, self.n, parents=tuple(parents), on_parent_failure=policy,
                    **self.extra())  # fmt: skip

    def step(self) -> tuple[str, Any]:
        ids = sorted(t.task_id for t in self.ref.query())
        roll = self.rng.random()
        if roll < 0.15 or not ids:
            return "create", self.plain()
        if roll < 0.35:
            return "create", self.child(ids)
        if roll < 0.55:
            current = self.ref.get(self.rng.choice(ids))
            assert current is not None
            return "save", moved(current, next_status(self.rng, current))
        if roll < 0.8:
            return "commit", self.commit(ids)
        if roll < 0.9:
            return "prune", self.rng.randint(0, 3)
        if roll < 0.95:
            return "expire", self.rng.randint(1, 3)
        return "release", self.rng.randint(1, 3)

    def commit(self, ids: list[str]) -> list[tuple[TaskSnapshot, int | None, list[Transition]]]:
        items: list[tuple[TaskSnapshot, int | None, list[Transition]]] = []
        known, touched = list(ids), set()
        for _ in range(self.rng.randint(1, 4)):
            roll = self.rng.random()
            if roll < 0.25:
                new = self.plain()
                items.append(
                    (new, None, [Transition(new.task_id, 1, None, new.status, new.created_at)])
                )
            elif roll < 0.5:
                new = self.child(known)
                items.append((new, None, []))
            else:
                free = [i for i in ids if i not in touched]
                if not free:
                    continue
                current = self.ref.get(self.rng.choice(free))
                assert current is not None
                items.append((moved(current, next_status(self.rng, current)),
                              current.status_version, []))  # fmt: skip
            if items[-1][1] is None:
                known.append(items[-1][0].task_id)  # a parent for the items after it
            touched.add(items[-1][0].task_id)
        return items or [(self.plain(), None, [])]


def run(store: Any, kind: str, arg: Any) -> Any:
    """The operation's result, or the name of the error it raised."""
    try:
        if kind == "create":
            return store.create(arg)
        if kind == "save":
            return store.save(arg, expect_version=arg.status_version - 1)
        if kind == "commit":
            return [None if e is None else type(e).__name__ for e in store.commit_tasks(arg)]
        if kind == "prune":
            return store.prune(keep_terminal=arg)
        if kind == "expire":
            return sorted(store.expire_finished(now=FAR, limit=arg))
        return store.release_dependents(limit=arg)
    except StoreError as error:
        return type(error).__name__


def describe(kind: str, arg: Any) -> str:
    def one(t: TaskSnapshot) -> str:
        return f"{t.task_id}:{t.status.value}@{t.status_version}{list(t.parents) or ''}"

    if kind == "commit":
        return "commit " + ", ".join(f"{one(t)} expect={e}" for t, e, _ in arg)
    return f"{kind} {one(arg) if isinstance(arg, TaskSnapshot) else arg}"


@pytest.mark.slow
def test_every_store_keeps_dependencies_as_the_reference_does(
    open_store: Callable[[], Any],
) -> None:
    failures = []
    for seed in range(SEEDS):
        reference, store = InMemoryTaskStore(), open_store()
        program, log = Program(seed, reference), []
        for _ in range(STEPS):
            kind, arg = program.step()
            log.append(describe(kind, arg))
            expected, got = run(reference, kind, arg), run(store, kind, arg)
            want, have = shown(reference), shown(store)
            if expected != got or want != have:
                diff = {k: (want.get(k), have.get(k)) for k in {*want, *have}
                        if want.get(k) != have.get(k)}  # fmt: skip
                failures.append(f"seed {seed}: result {expected!r} / {got!r}, differs: {diff}\n  "
                                + "\n  ".join(log[-6:]))  # fmt: skip
                break
    assert not failures, "\n\n".join(failures[:3]) + f"\n({len(failures)} of {SEEDS} seeds)"
