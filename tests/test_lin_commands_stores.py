"""The command lease check bites on real stores: recorded claimers racing over the same control
commands (claiming, completing, releasing, letting leases run out) on a real Redis, SQLite and
the in-memory store are linearizable; a store whose claim reads the claimable commands and
leases them a moment later (so it hands out a command another claimer holds) is not."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.model import Command, CommandKind
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from chongming_redis.stress import oplog
from tests.support.redis_server import RedisProc

T0 = datetime.now(timezone.utc)
COMMANDS = [f"c{i:02}" for i in range(12)]
LEASE = 0.05  # seconds: short, so leases run out during the drive and commands are re-claimed


class TwoStepClaimStore(InMemoryTaskStore):
    """BROKEN on purpose: ``claim_commands`` picks the claimable commands, then, a moment
    later, leases them without looking again (a check-then-act race: two claimers both get a
    command, each believing it holds the only valid lease)."""

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        moment, until = encode_dt(now), encode_dt(now + timedelta(seconds=lease_seconds))
        with self._lock:
            ready = sorted(
                (r for r in self._commands.values()
                 if r["finished_at"] is None
                 and (r["lease_until"] is None or r["lease_until"] <= moment)),  # type: ignore[operator]
                key=lambda r: (r["created_at"], r["command_id"]),
            )[:limit]  # fmt: skip
        time.sleep(0.02)  # the window between the check and the write
        with self._lock:
            for row in ready:
                row["lease_until"] = until
        return [c for r in ready if (c := self.get_command(str(r["command_id"]))) is not None]


def _opener(
    kind: str, recorder: oplog.Recorder, request: pytest.FixtureRequest
) -> Callable[[], Any]:
    """A function opening one more recorded client of one shared store."""
    if kind == "redis":
        server: RedisProc = request.getfixturevalue("redis_proc")
        namespace: str = request.getfixturevalue("namespace")
        cls: Any = oplog.record_class(type("RecordedRedis", (RedisTaskStore,), {}), recorder)
        return lambda: cls.from_url(server.url, namespace=namespace)
    if kind == "sqlite":
        path = request.getfixturevalue("tmp_path") / "tasks.db"
        sqlite_cls: Any = oplog.record_class(type("RecordedSqlite", (SqliteTaskStore,), {}),
                                             recorder)  # fmt: skip
        return lambda: sqlite_cls(path)
    base = TwoStepClaimStore if kind == "two-step-claim" else InMemoryTaskStore
    shared = oplog.record_class(type("RecordedMemory", (base,), {}), recorder)()
    return lambda: shared


def submit_all(store: Any) -> None:
    for i, command_id in enumerate(COMMANDS):
        created = T0 + timedelta(microseconds=i)
        store.submit_command(Command(command_id, f"t{i}", CommandKind.STOP, created))


def claim_rounds(store: Any, seed: int, rounds: int, barrier: threading.Barrier | None) -> int:
    """Claim in rounds (all claimers at once when ``barrier``); complete, release or keep each
    command claimed (its lease then runs out); read one command back. Returns the claims."""
    rng, claims = random.Random(seed), 0
    for _ in range(rounds):
        if barrier is not None:
            barrier.wait(timeout=30)
        now = datetime.now(timezone.utc)  # the caller's clock, as a worker passes it
        claimed = store.claim_commands(now=now, lease_seconds=LEASE, limit=2)
        claims += len(claimed)
        for command in claimed:
            choice = rng.random()
            if choice < 0.25:
                store.complete_command(command.command_id, now=now, outcome=f"by {seed}")
            elif choice < 0.6:
                store.release_command(command.command_id, now=now)
        store.get_command(rng.choice(COMMANDS))
        time.sleep(0.01)  # pacing, so that leases kept run out within the drive
    return claims


def _in_threads(bodies: list[Callable[[], int]]) -> list[int]:
    results: list[int] = []
    errors: list[BaseException] = []

    def run(body: Callable[[], int]) -> None:
        try:
            results.append(body())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("kind", ["memory", "redis", "sqlite", "two-step-claim"])
def test_concurrent_claimers_over_the_same_commands(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    recorder = oplog.Recorder(tmp_path / "ops")
    open_store = _opener(kind, recorder, request)
    store = open_store()
    submit_all(store)
    claimers, rounds = 3, 15
    barrier = threading.Barrier(claimers)

    def claimer(seed: int) -> Callable[[], int]:
        return lambda: claim_rounds(open_store(), seed, rounds, barrier)

    claims = sum(_in_threads([claimer(seed) for seed in range(claimers)]))
    recorder.close()
    report = oplog.check_dir(recorder.directory, read_command=store.get_command)
    assert claims > len(COMMANDS), "the drive must re-claim released and expired commands"
    assert report["commands"]["histories"] == len(COMMANDS) and report["unknown"] == []
    assert report["commands"]["operations"] >= len(COMMANDS) * 2 + claims
    if kind != "two-step-claim":
        assert report["violations"] == []
        return
    assert report["violations"], "a claim that checks and leases in two steps must be caught"
    found = report["violations"][0]
    assert found["kind"] == "not_linearizable" and found["command_id"] in COMMANDS
    assert "\n".join(found["example"]).count("claim by") >= 2


CLAIMER = """
import sys, time
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress import oplog
from tests.test_lin_commands_stores import claim_rounds
oplog.install()
store = RedisTaskStore.from_url(sys.argv[1], namespace=sys.argv[2])
time.sleep(max(0.0, (int(sys.argv[3]) - time.monotonic_ns()) / 1e9))
print(claim_rounds(store, int(sys.argv[4]), 15, None))
"""


def test_claimer_processes_recorded_through_the_environment(
    tmp_path: Path, redis_proc: RedisProc, namespace: str
) -> None:
    """Separate processes, ``install()`` from the environment, one clock (CLOCK_MONOTONIC)."""
    directory = tmp_path / "ops"
    recorder = oplog.Recorder(directory)  # the producer, in this process
    producer: Any = oplog.record_class(type("RecordedRedis", (RedisTaskStore,), {}), recorder)
    store: Any = producer.from_url(redis_proc.url, namespace=namespace)
    submit_all(store)
    env = {**os.environ, oplog.OPLOG_ENV: str(directory)}
    start_at = time.monotonic_ns() + 2_000_000_000  # every process imported by then
    claimers = [subprocess.Popen([sys.executable, "-c", CLAIMER, redis_proc.url, namespace,
                                  str(start_at), str(seed)], env=env, stdout=subprocess.PIPE,
                                 text=True)
                for seed in range(3)]  # fmt: skip
    outputs = [p.communicate(timeout=60)[0] for p in claimers]
    assert [p.returncode for p in claimers] == [0, 0, 0]
    recorder.close()
    report = oplog.check_dir(directory, read_command=store.get_command)
    store.close()
    assert sum(int(out) for out in outputs) > len(COMMANDS)
    assert report["processes"] == 4 and report["unclean_exits"] == 0
    assert report["commands"]["histories"] == len(COMMANDS)
    assert report["violations"] == [] and report["unknown"] == []


@pytest.mark.parametrize("kind", ["redis", "memory", "sqlite"])
def test_a_lease_one_claim_found_ended_is_not_claimable_by_an_earlier_now(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A claim whose now ended two leases but whose limit takes one leaves the other leased: a
    claimer passing an earlier now gets the next command, on every store (the Redis claim script
    once handed the ended lease back to the queue, and this check found it). The same history
    with the earlier now getting that command, as the old script answered, is reported."""
    recorder = oplog.Recorder(tmp_path / "ops")
    store = _opener(kind, recorder, request)()
    submit_all(store)

    def at(ms: int) -> datetime:
        return T0 + timedelta(milliseconds=ms)

    assert len(store.claim_commands(now=at(0), lease_seconds=0.05, limit=2)) == 2  # c00, c01
    ahead = store.claim_commands(now=at(60), lease_seconds=0.05, limit=1)  # ends both, takes c00
    assert [c.command_id for c in ahead] == ["c00"]
    behind = store.claim_commands(now=at(10), lease_seconds=0.05, limit=1)
    assert [c.command_id for c in behind] == ["c02"]
    recorder.close()
    report = oplog.check_dir(recorder.directory, read_command=store.get_command)
    assert report["violations"] == []
    (path,) = recorder.directory.glob("ops-*.jsonl")
    lines = path.read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if '"r":[["c02",' in line)
    lines[last] = lines[last].replace('"c02"', '"c01"')  # the old Redis script's answer
    path.write_text("\n".join(lines) + "\n")
    (found,) = oplog.check_dir(recorder.directory)["violations"]
    assert found["command_id"] == "c01"
