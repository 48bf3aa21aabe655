"""Worker entry points for the cross-process tests, each run as a real OS process:

    python -m tests.support.workers <role> --url STORE-URL --namespace NS --name NAME ...

``STORE-URL`` names the store every process opens: ``redis://...`` (with ``--namespace``),
``postgresql://...`` (``--namespace`` is the schema) or ``sqlite:///abs/path`` (``open_store``).

Roles (see ``stress/test_cross_process.py`` and ``stress/test_redis_cross_process.py`` for what
each one proves):

``save-racer``  rounds of "everyone saves the same version of one task": prints ``ready``, then
                per round waits for the round number on stdin, saves, prints the outcome
``claimer``     waits for "go" on stdin, claims commands until none is left, completing each
                with outcome = its name (logged to ``--out``)
``victim``      claims one batch with a short lease, reports it, then sleeps until SIGKILLed
``grabber``     waits for "go" on stdin, claims once with the real clock, reports, exits
``writer``      mixed create/save/append/claim/complete load; logs every op as one JSON line

Every process is coordinated through its stdin and stdout (the test writes the barrier's "go"
to all of them at once), never through the store under test, whose server may be killed. Every
line a worker writes is flushed at once, so a killed worker's file holds every line it wrote
before dying.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from chongming_redis.errors import (
    ConcurrencyConflict,
    StoreError,
    StoreUnavailable,
)
from chongming_redis.model import Command, CommandKind, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore

#: Generous bound on any wait for the test process; a worker never outlives it by much.
WAIT_SECONDS = 30


SQLITE_URL = "sqlite://"


POSTGRES_URLS = ("postgresql://", "postgres://")


def open_store(url: str, namespace: str, **redis_options: Any) -> Any:
    """The store ``url`` names: ``sqlite:///abs/path``, a PostgreSQL DSN (the schema
    ``namespace``) or a Redis URL (in ``namespace``)."""
    if url.startswith(SQLITE_URL):
        return SqliteTaskStore(url[len(SQLITE_URL) :])
    if url.startswith(POSTGRES_URLS):
        from chongming_redis.stores.postgres import PostgresTaskStore

        return PostgresTaskStore(url, schema=namespace)
    return RedisTaskStore.from_url(url, namespace=namespace, **redis_options)


def _wait_for(line: str) -> None:
    if sys.stdin.readline().strip() != line:
        raise RuntimeError(f"expected {line!r} on stdin")


#: The instant the cross-process tests' records are created at.
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def command(i: int) -> Command:
    """The ``i``-th command of a cross-process test: ids and times in submission order."""
    return Command(
        command_id=f"cmd-{i:05d}",
        task_id=f"task-{i % 17}",
        kind=CommandKind.STOP,
        created_at=T0 + timedelta(microseconds=i),
        issued_by="test",
    )


def submit_all(store: Any, commands: list[Command]) -> None:
    """Setup only: a few threads, so a server that syncs every write is not the bottleneck."""
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(store.submit_command, commands))


def racer_snapshot(base: TaskSnapshot, index: int, name: str) -> TaskSnapshot:
    """What racer number ``index`` saves over ``base`` (version 1). The version is unique per
    racer (versions may jump), so the stored version alone names the winner."""
    return replace(
        base,
        status=TaskStatus.RUNNING,
        status_version=2 + index,
        updated_at=base.updated_at + timedelta(microseconds=index + 1),
        result={"winner": name},
        bucket=index % 3,
        tags=frozenset({"raced", f"by-{name}"}),
    )


def _emit(stream: IO[str], record: dict[str, Any]) -> None:
    stream.write(json.dumps(record, sort_keys=True) + "\n")
    stream.flush()


def _us(moment: datetime) -> int:
    return encode_dt(moment)


def _now() -> datetime:
    return datetime.now(UTC)


# -- save-racer ----------------------------------------------------------------------------


def run_save_racer(args: argparse.Namespace) -> int:
    store = open_store(args.url, args.namespace)
    try:
        task_ids = [f"race-{r}" for r in range(args.rounds)]
        bases = {tid: store.get(tid) for tid in task_ids}
        snapshots = {}
        for tid, base in bases.items():
            if base is None or base.status_version != 1:
                raise RuntimeError(f"{tid} is not ready: {base}")
            snapshots[tid] = racer_snapshot(base, args.index, args.name)
        _emit(sys.stdout, {"ready": args.name})
        for _ in range(args.rounds):
            round_no = int(sys.stdin.readline())  # the barrier: the test writes to all at once
            snapshot = snapshots[f"race-{round_no}"]
            t0 = time.monotonic()
            record: dict[str, Any] = {"round": round_no, "name": args.name}
            try:
                store.save(snapshot, expect_version=1)
                record["outcome"] = "ok"
            except ConcurrencyConflict as exc:
                record.update(outcome="conflict", actual=exc.actual)
            except StoreError as exc:
                record.update(outcome="error", error=repr(exc))
            record["t0"], record["t1"] = t0, time.monotonic()
            _emit(sys.stdout, record)
        return 0
    finally:
        store.close()


# -- claimer -------------------------------------------------------------------------------


def run_claimer(args: argparse.Namespace) -> int:
    store = open_store(args.url, args.namespace)
    try:
        with Path(args.out).open("w", encoding="utf-8") as out:
            _emit(sys.stdout, {"ready": args.name})
            _wait_for("go")
            while True:
                now = _now()
                batch = store.claim_commands(now=now, lease_seconds=60, limit=args.limit)
                _emit(
                    out,
                    {
                        "claim": [c.command_id for c in batch],
                        "now": _us(now),
                        "leases": [_us(c.lease_until) for c in batch if c.lease_until],
                        "t": time.monotonic(),
                    },
                )
                if not batch:
                    return 0
                for command in batch:
                    store.complete_command(command.command_id, now=_now(), outcome=args.name)
                    _emit(out, {"completed": command.command_id})
                time.sleep(args.pause)  # the work a real consumer does between claims
    finally:
        store.close()


# -- victim and grabber --------------------------------------------------------------------


def run_victim(args: argparse.Namespace) -> int:
    store = open_store(args.url, args.namespace)
    now = _now()
    batch = store.claim_commands(now=now, lease_seconds=args.lease, limit=args.limit)
    _emit(
        sys.stdout,
        {
            "claimed": [c.command_id for c in batch],
            "leases": [_us(c.lease_until) for c in batch if c.lease_until],
            "now": _us(now),
        },
    )
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:  # hold the lease until SIGKILL (never exits on its own)
        time.sleep(0.1)
    return 3


def run_grabber(args: argparse.Namespace) -> int:
    store = open_store(args.url, args.namespace)
    try:
        _emit(sys.stdout, {"ready": args.name})
        if sys.stdin.readline().strip() != "go":
            return 2
        now = _now()
        batch = store.claim_commands(now=now, lease_seconds=60, limit=1000)
        _emit(sys.stdout, {"claimed": [c.command_id for c in batch], "now": _us(now)})
        return 0
    finally:
        store.close()


# -- writer (load for the kill -9 of Redis) ------------------------------------------------

_LIVE = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED)


class Writer:
    """Mixed load on tasks of its own (no conflicts expected), logging each op's outcome:
    ``ok`` (acknowledged), ``info`` (indeterminate: the store failed during the call) or
    ``fail`` (a definite refusal, never expected here)."""

    def __init__(self, args: argparse.Namespace, log: IO[str]) -> None:
        self.args = args
        self.name: str = args.name
        self.log = log
        self.rng = random.Random(args.seed)
        self.store = RedisTaskStore.from_url(
            args.url,
            namespace=args.namespace,
            socket_timeout=1,
            socket_connect_timeout=0.5,
            retries=1,
        )
        self.tasks: dict[str, TaskSnapshot] = {}  # last acknowledged snapshot of each task
        self.unappended: list[Transition] = []  # transitions of acked saves, not yet appended
        self.claimed: list[str] = []  # acked claims not yet completed
        self.created = 0

    def close(self) -> None:
        self.store.close()

    def op_create(self) -> tuple[dict[str, Any], Any]:
        self.created += 1
        now = _now()
        snapshot = TaskSnapshot(
            task_id=f"{self.name}-t{self.created}",
            name=f"job-{self.name}",
            status=TaskStatus.PENDING,
            status_version=1,
            created_at=now,
            updated_at=now,
            tags=frozenset({self.name}),
            bucket=self.rng.randrange(4),
            result={"v": 1},
        )

        def call() -> None:
            self.store.create(snapshot)
            self.tasks[snapshot.task_id] = snapshot
            self.unappended.append(
                Transition(snapshot.task_id, 1, None, snapshot.status, now, "created")
            )

        return self._task_record("create", snapshot), call

    def op_save(self) -> tuple[dict[str, Any], Any]:
        old = self.tasks[self.rng.choice(sorted(self.tasks))]
        version = old.status_version + self.rng.choice((1, 1, 1, 2))  # versions may jump
        status = self.rng.choice([s for s in TaskStatus if s is not TaskStatus.WAITING])
        snapshot = replace(
            old,
            status=status,
            status_version=version,
            updated_at=_now(),
            bucket=self.rng.randrange(4),
            result={"v": version},
            tags=frozenset({self.name, f"v{version % 3}"}),
        )

        def call() -> None:
            self.store.save(snapshot, expect_version=old.status_version)
            self.tasks[snapshot.task_id] = snapshot
            self.unappended.append(
                Transition(snapshot.task_id, version, old.status, status, snapshot.updated_at)
            )

        record = self._task_record("save", snapshot)
        record["expect"] = old.status_version
        return record, call

    def op_append(self) -> tuple[dict[str, Any], Any]:
        transition = self.unappended[0]
        record = {
            "op": "append",
            "task": transition.task_id,
            "version": transition.version,
            "to": transition.to_status.value,
        }

        def call() -> None:
            self.store.append(transition)
            self.unappended.pop(0)

        return record, call

    def op_claim(self) -> tuple[dict[str, Any], Any]:
        record: dict[str, Any] = {"op": "claim"}

        def call() -> None:
            batch = self.store.claim_commands(now=_now(), lease_seconds=300, limit=2)
            record["cmds"] = [[c.command_id, _us(c.lease_until)] for c in batch if c.lease_until]
            self.claimed.extend(c.command_id for c in batch)

        return record, call

    def op_complete(self) -> tuple[dict[str, Any], Any]:
        command_id = self.claimed[0]
        record = {"op": "complete", "cid": command_id, "by": self.name}

        def call() -> None:
            self.store.complete_command(command_id, now=_now(), outcome=self.name)
            self.claimed.pop(0)

        return record, call

    @staticmethod
    def _task_record(op: str, snapshot: TaskSnapshot) -> dict[str, Any]:
        return {
            "op": op,
            "task": snapshot.task_id,
            "version": snapshot.status_version,
            "status": snapshot.status.value,
            "bucket": snapshot.bucket,
        }

    def next_op(self) -> tuple[dict[str, Any], Any]:
        choices = ["create", "claim"]
        if self.tasks:
            choices += ["save"] * 3
        if self.unappended:
            choices += ["append"] * 2
        if self.claimed:
            choices.append("complete")
        if len(self.tasks) < 3:
            choices.append("create")
        result: tuple[dict[str, Any], Any] = getattr(self, "op_" + self.rng.choice(choices))()
        return result

    def run(self, deadline: float) -> int:
        while time.monotonic() < deadline:
            record, call = self.next_op()
            record["proc"] = self.name
            record["t0"] = time.monotonic()
            try:
                call()
                record["outcome"] = "ok"
            except StoreUnavailable as exc:
                record.update(outcome="info", unavailable=True, error=repr(exc))
            except StoreError as exc:
                # A definite refusal (conflict, exists) is "fail"; anything else is unknown.
                definite = isinstance(exc, ConcurrencyConflict)
                record.update(outcome="fail" if definite else "info", error=repr(exc))
            record["t1"] = time.monotonic()
            _emit(self.log, record)
            if record["outcome"] != "ok":
                return 0  # Redis is gone (or something is wrong): stop, the test checks
        return 0


def run_writer(args: argparse.Namespace) -> int:
    with Path(args.out).open("w", encoding="utf-8") as log:
        writer = Writer(args, log)
        try:
            _emit(sys.stdout, {"ready": args.name})
            if sys.stdin.readline().strip() != "go":
                return 2
            return writer.run(time.monotonic() + args.max_seconds)
        finally:
            writer.close()


# -- entry point ---------------------------------------------------------------------------

ROLES = {
    "save-racer": run_save_racer,
    "claimer": run_claimer,
    "victim": run_victim,
    "grabber": run_grabber,
    "writer": run_writer,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.workers")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--limit", type=int, default=7)
    parser.add_argument("--pause", type=float, default=0.0, help="claimer: seconds between claims")
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    return ROLES[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
