"""Cross-process proofs for ``RedisTaskStore`` (store guide §6, RELIABILITY F1/F4 and Checkers).

The contract suite runs on one connection; these tests run real OS processes
(``python -m tests.support.workers``) against a real redis-server and count outcomes:

1. 8 processes ``save`` the same version of one task, round after round: exactly one wins.
2. 8 consumer processes drain 1,000 commands: every command is claimed exactly once.
3. A claimer SIGKILLed while holding a lease: its commands stay leased until ``lease_until``,
   then are claimable exactly once.
4. kill -9 of redis-server under a mixed write load: every acknowledged write survives the
   restart, nothing is half-applied, and whatever else was found is explained by an
   indeterminate op.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from chongming_redis.model import (
    Command,
    CommandKind,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
)
from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.support.workers import coord_key, racer_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2030, 1, 1, tzinfo=UTC)


# -- process handling -------------------------------------------------------------------------


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    name: str
    stderr_path: Path
    buffer: bytes = b""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def read_json(self, timeout: float = 15.0) -> dict[str, Any]:
        """The next stdout line as JSON, waiting at most ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no line within {timeout}s; {self.stderr()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"{self.name} closed stdout; {self.stderr()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def stderr(self) -> str:
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return f"stderr of {self.name}:\n{text[-3000:]}"


@dataclass
class Spawner:
    """Starts worker processes and always reaps them: SIGKILL by pid for any still running."""

    tmp: Path
    workers: list[Worker] = field(default_factory=list)

    def start(self, role: str, name: str, *args: str) -> Worker:
        stderr_path = self.tmp / f"{name}.stderr"
        with stderr_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.workers", role, "--name", name, *args],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                bufsize=0,
            )
        worker = Worker(proc, name, stderr_path)
        self.workers.append(worker)
        return worker

    def wait_all(self, timeout: float, workers: list[Worker] | None = None) -> None:
        """Wait for ``workers`` (default: all) to exit, each with status 0."""
        deadline = time.monotonic() + timeout
        for worker in self.workers if workers is None else workers:
            try:
                code = worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{worker.name} still running; {worker.stderr()}") from None
            assert code == 0, f"{worker.name} exited with {code}; {worker.stderr()}"

    def cleanup(self) -> None:
        for worker in self.workers:
            proc = worker.proc
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)  # only pids this spawner started
            proc.wait(10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with suppress(BrokenPipeError):
                        pipe.close()


@contextmanager
def spawner(tmp: Path) -> Iterator[Spawner]:
    spawned = Spawner(tmp)
    try:
        yield spawned
    finally:
        spawned.cleanup()


@pytest.fixture
def store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    s = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield s
    s.close()


@pytest.fixture
def coord(redis_proc: RedisProc) -> Iterator[redis.Redis]:
    client = redis_proc.client(socket_timeout=40)
    yield client
    client.close()


def task(
    task_id: str, *, status: TaskStatus = TaskStatus.PENDING, version: int = 1
) -> TaskSnapshot:
    return TaskSnapshot(
        task_id=task_id,
        name="cross-process",
        status=status,
        status_version=version,
        created_at=T0,
        updated_at=T0,
        tags=frozenset({"raced"}),
        params={"n": task_id},
    )


def command(i: int) -> Command:
    return Command(
        command_id=f"cmd-{i:05d}",
        task_id=f"task-{i % 17}",
        kind=CommandKind.STOP,
        created_at=T0 + timedelta(microseconds=i),
        issued_by="test",
    )


def submit_all(s: RedisTaskStore, commands: list[Command]) -> None:
    """Setup only: a few threads so the fsync-per-write server is not the bottleneck."""
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(s.submit_command, commands))


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def raw_command(s: RedisTaskStore, client: redis.Redis, command_id: str) -> Command:
    """A command as stored (the protocol has no getter for one)."""
    fields = client.hgetall(s.keys.command(command_id))
    assert fields, f"command {command_id} is missing"
    return s._decode_command(command_id, fields)


# -- 1. eight processes save the same version ------------------------------------------------

RACERS = 8
ROUNDS = 25


def test_concurrent_save_of_one_version_has_exactly_one_winner(
    redis_proc: RedisProc,
    store: RedisTaskStore,
    coord: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    bases = {r: task(f"race-{r}") for r in range(ROUNDS)}
    for base in bases.values():
        store.create(base)
    names = [f"racer{i}" for i in range(RACERS)]
    results_key = coord_key(namespace, "results")
    winners: list[str] = []
    spreads: list[float] = []
    overlapped = 0  # rounds in which all 8 saves were in flight at one moment
    with spawner(tmp_path) as spawned:
        for i, name in enumerate(names):
            spawned.start(
                "save-racer",
                name,
                *("--url", redis_proc.url, "--namespace", namespace),
                *("--index", str(i), "--rounds", str(ROUNDS)),
            )
        ready = {json.loads(coord.blpop([results_key], 30)[1])["ready"] for _ in names}
        assert ready == set(names)
        for r in range(ROUNDS):
            with coord.pipeline(transaction=True) as pipe:  # the barrier: all 8 wake at once
                for name in names:
                    pipe.rpush(coord_key(namespace, "go", name), r)
                pipe.execute()
            outcomes = []
            for _ in names:
                popped = coord.blpop([results_key], 30)
                assert popped is not None, f"round {r}: a racer did not report"
                outcomes.append(json.loads(popped[1]))
            assert {o["round"] for o in outcomes} == {r}
            assert sorted(o["name"] for o in outcomes) == sorted(names)
            ok = [o["name"] for o in outcomes if o["outcome"] == "ok"]
            conflicts = [o for o in outcomes if o["outcome"] == "conflict"]
            assert len(ok) == 1, f"round {r}: winners {ok}, outcomes {outcomes}"
            assert len(conflicts) == RACERS - 1, f"round {r}: {outcomes}"
            winner = ok[0]
            winners.append(winner)
            expected = racer_snapshot(bases[r], names.index(winner), winner)
            # Each loser saw the winner's version, and the store holds the winner's snapshot
            # (the version alone names the racer: each one writes 2 + its index).
            assert {c["actual"] for c in conflicts} == {expected.status_version}
            assert store.get(f"race-{r}") == expected
            starts = [o["t0"] for o in outcomes]
            spreads.append(max(starts) - min(starts))
            overlapped += max(starts) < min(o["t1"] for o in outcomes)
        spawned.wait_all(30)
    # The barrier worked: in every round the 8 calls started close together (typically a few
    # ms apart; the bound is loose for a loaded 2-core machine).
    assert max(spreads) < 1.0, spreads
    # Indexes agree with the snapshots: every task moved out of PENDING exactly once.
    counts = store.counts()
    assert counts[TaskStatus.RUNNING] == ROUNDS
    assert counts[TaskStatus.PENDING] == 0
    assert len(store.query(TaskQuery(tag="raced"))) == ROUNDS
    print(
        f"\n[save race] {ROUNDS} rounds x {RACERS} processes: 1 winner + {RACERS - 1} conflicts"
        f" every round; wins per racer {dict(sorted(Counter(winners).items()))};"
        f" start spread median {sorted(spreads)[len(spreads) // 2] * 1000:.1f}ms,"
        f" max {max(spreads) * 1000:.1f}ms; all 8 in flight together in {overlapped} rounds;"
        f" {time.monotonic() - started:.2f}s"
    )


# -- 2. eight consumers drain 1,000 commands -------------------------------------------------

CONSUMERS = 8
COMMANDS = 1000


def test_concurrent_consumers_claim_every_command_exactly_once(
    redis_proc: RedisProc,
    store: RedisTaskStore,
    coord: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    commands = [command(i) for i in range(COMMANDS)]
    submit_all(store, commands)
    all_ids = {c.command_id for c in commands}
    names = [f"consumer{i}" for i in range(CONSUMERS)]
    with spawner(tmp_path) as spawned:
        for name in names:
            spawned.start(
                "claimer",
                name,
                *("--url", redis_proc.url, "--namespace", namespace),
                *("--limit", "7", "--out", str(tmp_path / f"{name}.jsonl")),
            )
        ready = {coord.blpop([coord_key(namespace, "ready")], 30)[1].decode() for _ in names}
        assert ready == set(names)
        drain_started = time.monotonic()
        with coord.pipeline(transaction=True) as pipe:
            for name in names:
                pipe.rpush(coord_key(namespace, "go", name), "go")
            pipe.execute()
        spawned.wait_all(45)
        drained = time.monotonic() - drain_started

    claimed_by: dict[str, list[str]] = {}
    calls: dict[str, int] = {}
    windows = []
    for name in names:
        records = read_lines(tmp_path / f"{name}.jsonl")
        claims = [r for r in records if "claim" in r]
        assert claims and claims[-1]["claim"] == [], f"{name} did not claim until empty"
        claimed_by[name] = [cid for r in claims for cid in r["claim"]]
        completed = [r["completed"] for r in records if "completed" in r]
        assert completed == claimed_by[name], f"{name} completed what it claimed, in order"
        assert all(len(r["claim"]) <= 7 for r in claims)
        calls[name] = len(claims)
        busy = [r["t"] for r in claims if r["claim"]]
        if busy:
            windows.append((min(busy), max(busy)))
    everything = [cid for ids in claimed_by.values() for cid in ids]
    duplicates = [cid for cid, n in Counter(everything).items() if n > 1]
    assert not duplicates, f"claimed more than once: {duplicates[:20]}"
    assert set(everything) == all_ids and len(everything) == COMMANDS
    # Concurrency really happened: every consumer got work, and their claim windows overlap.
    assert all(claimed_by[name] for name in names), {n: len(v) for n, v in claimed_by.items()}
    assert max(start for start, _ in windows) < min(end for _, end in windows)

    # All finished, each with the outcome of the process that claimed it, and never claimed
    # again: not even a claimer whose clock is a day ahead (every lease long expired) gets one.
    owner = {cid: name for name, ids in claimed_by.items() for cid in ids}
    for cid in sorted(all_ids):
        stored = raw_command(store, coord, cid)
        assert stored.finished_at is not None and stored.outcome == owner[cid], stored
    assert store.claim_commands(now=datetime.now(UTC) + timedelta(days=1), lease_seconds=1) == []
    per_process = {n: len(claimed_by[n]) for n in names}
    print(
        f"\n[claim drain] {COMMANDS} commands, {CONSUMERS} processes, limit 7: claimed once each,"
        f" 0 duplicates; per process {per_process}; claim calls {calls};"
        f" drain {drained:.2f}s, total {time.monotonic() - started:.2f}s"
    )


# -- 3. a claimer is SIGKILLed holding a lease -----------------------------------------------


def test_sigkilled_claimers_commands_stay_leased_until_lease_until_then_return_once(
    redis_proc: RedisProc,
    store: RedisTaskStore,
    namespace: str,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    commands = [command(i) for i in range(10)]
    for c in commands:
        store.submit_command(c)
    flags = ["--url", redis_proc.url, "--namespace", namespace]
    with spawner(tmp_path) as spawned:
        grabber = spawned.start("grabber", "grabber", *flags)
        assert grabber.read_json() == {"ready": "grabber"}
        victim = spawned.start("victim", "victim", *flags, "--lease", "2", "--limit", "6")
        report = victim.read_json()
        os.kill(victim.proc.pid, signal.SIGKILL)  # right after it claimed
        assert victim.proc.wait(10) == -signal.SIGKILL
        killed_at = datetime.now(UTC)
        grabber.send("go")  # a live process claims with the real clock, right after the kill
        grabbed = grabber.read_json()
        spawned.wait_all(15, [grabber])

    victims = report["claimed"]
    assert victims == [c.command_id for c in commands[:6]]  # oldest first
    assert len(set(report["leases"])) == 1, "one claim, one lease_until"
    lease_until = decode_dt(report["leases"][0])
    assert lease_until == decode_dt(report["now"]) + timedelta(seconds=2)
    # The grabber ran while the dead victim's lease was still valid (else this proves nothing),
    # and it got only the commands the victim had not taken.
    assert decode_dt(grabbed["now"]) < lease_until, "grabber ran too late to prove anything"
    assert grabbed["claimed"] == [c.command_id for c in commands[6:]]

    # Explicit clocks around the dead lease: one microsecond before lease_until none of them
    # is claimable; at lease_until all of them are, exactly once.
    before = store.claim_commands(
        now=lease_until - timedelta(microseconds=1), lease_seconds=60, limit=1000
    )
    assert before == []
    after = store.claim_commands(now=lease_until, lease_seconds=60, limit=1000)
    assert [c.command_id for c in after] == victims
    assert {c.lease_until for c in after} == {lease_until + timedelta(seconds=60)}
    assert store.claim_commands(now=lease_until, lease_seconds=60, limit=1000) == []
    kill_delay = (killed_at - decode_dt(report["now"])).total_seconds()
    print(
        f"\n[sigkill claimer] victim pid leased {len(victims)} commands until "
        f"{lease_until.isoformat()}, killed {kill_delay:.3f}s"
        f" after its claim; live grabber got {len(grabbed['claimed'])} others and 0 of the"
        f" victim's; claim at lease_until-1us: 0; at lease_until: {len(after)} (once);"
        f" {time.monotonic() - started:.2f}s"
    )


# -- 4. kill -9 of redis-server under load ---------------------------------------------------

WRITERS = 4
LOAD_SECONDS = 1.5
LOAD_COMMANDS = 600


def test_kill9_of_redis_under_load_loses_no_acknowledged_write(
    fresh_redis_proc: RedisProc, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    server = fresh_redis_proc
    setup = RedisTaskStore.from_url(server.url, namespace=namespace)
    try:
        commands = [command(i) for i in range(LOAD_COMMANDS)]
        submit_all(setup, commands)
    finally:
        setup.close()
    names = [f"writer{i}" for i in range(WRITERS)]
    logs = {name: tmp_path / f"{name}.jsonl" for name in names}
    with spawner(tmp_path) as spawned:
        writers = [
            spawned.start(
                "writer",
                name,
                *("--url", server.url, "--namespace", namespace),
                *("--seed", str(i), "--out", str(logs[name]), "--max-seconds", "20"),
            )
            for i, name in enumerate(names)
        ]
        for w in writers:
            assert w.read_json() == {"ready": w.name}
        for w in writers:
            w.send("go")
        time.sleep(LOAD_SECONDS)
        for w in writers:
            assert w.proc.poll() is None, f"{w.name} stopped before the kill; {w.stderr()}"
        kill_started = time.monotonic()
        server.kill9()
        kill_done = time.monotonic()
        spawned.wait_all(20)  # each writer sees StoreUnavailable and exits
    stopped_at = time.monotonic()
    server.restart()
    restarted = time.monotonic() - stopped_at

    records = {name: read_lines(path) for name, path in logs.items()}
    acked = [r for name in names for r in records[name] if r["outcome"] == "ok"]
    unknown = [r for name in names for r in records[name] if r["outcome"] != "ok"]
    # The kill happened mid-load: every writer was acknowledged before it, and every writer's
    # only failure is a StoreUnavailable after it (its last op; it then stopped).
    for name in names:
        mine = records[name]
        assert any(r["outcome"] == "ok" and r["t1"] < kill_started for r in mine), name
        assert [r["outcome"] for r in mine].count("ok") == len(mine) - 1, name
        last = mine[-1]
        assert last["outcome"] == "info" and last.get("unavailable"), last
        assert last["t1"] > kill_started, f"{name} failed before the kill: {last}"
    # An op that only began after the server was dead cannot have been acknowledged. (Its
    # end time says nothing: a writer may be descheduled between the reply and its clock read.)
    assert all(r["t0"] <= kill_done for r in acked), "an op was acknowledged by a dead server"

    store = RedisTaskStore.from_url(server.url, namespace=namespace)
    client = server.client(socket_timeout=5)
    try:
        found = check_durability(store, client, acked, unknown, commands)
    finally:
        store.close()
        client.close()
    ops = Counter(r["op"] for r in acked)
    print(
        f"\n[kill -9 redis] {WRITERS} writers, acked before the kill: {sum(ops.values())} ops"
        f" {dict(sorted(ops.items()))}; indeterminate (StoreUnavailable, one per writer):"
        f" {found['fates']}; after restart: {found['tasks']} tasks,"
        f" {found['versions_checked']} acked saves <= stored version,"
        f" {found['history']} acked appends in history, {found['leased']} acked leases held,"
        f" {found['finished']} acked completions finished; indexes and counts agree;"
        f" restart {restarted:.2f}s, total {time.monotonic() - started:.2f}s"
    )


def check_durability(
    store: RedisTaskStore,
    client: redis.Redis,
    acked: list[dict[str, Any]],
    unknown: list[dict[str, Any]],
    commands: list[Command],
) -> dict[str, Any]:
    """RELIABILITY Checkers/durability: acknowledged ⊆ recovered, and recovered minus
    acknowledged ⊆ indeterminate. Returns counts for the report."""
    # Every write of a task, by version: what the writer sent (acked or indeterminate).
    written: dict[str, dict[int, dict[str, Any]]] = {}
    for r in acked + unknown:
        if r["op"] in ("create", "save"):
            written.setdefault(r["task"], {})[r["version"]] = r
    acked_version: dict[str, int] = {}
    for r in acked:
        if r["op"] in ("create", "save"):
            acked_version[r["task"]] = max(acked_version.get(r["task"], 0), r["version"])
    unknown_versions = {(r["task"], r["version"]) for r in unknown if r["op"] in ("create", "save")}

    # Tasks: every acked create is there; the stored version is the last acked one or a later
    # indeterminate one, and the stored snapshot is what was sent for that version.
    stored_tasks = {t.task_id: t for t in store.query()}
    for task_id, versions in written.items():
        got = store.get(task_id)
        if task_id in acked_version:
            assert got is not None, f"acknowledged create of {task_id} lost"
            assert got.status_version >= acked_version[task_id], (task_id, got.status_version)
        if got is None:
            assert (task_id, 1) in unknown_versions, f"{task_id} neither acked nor pending"
            continue
        v = got.status_version
        assert v == acked_version.get(task_id) or (task_id, v) in unknown_versions, (task_id, v)
        sent = versions[v]
        assert (got.status.value, got.bucket, got.result) == (
            sent["status"],
            sent["bucket"],
            {"v": v},
        ), (task_id, got)
        assert stored_tasks.get(task_id) == got, f"{task_id} is missing from query()"
    # Nothing exists that nobody wrote: every task hash in the namespace is one of ours.
    hashes = {
        key.decode()[len(store.keys.task("")) :]
        for key in client.scan_iter(match=store.keys.task("") + "*", count=1000)
    }
    assert hashes == set(stored_tasks) == {t for t in written if store.get(t) is not None}

    # Nothing half-applied: each task is found in the index of its own status and bucket and
    # in no other, and the counters (per status, and per status:bucket) equal what query()
    # returns.
    indexed: Counter[str] = Counter()
    for status in TaskStatus:
        for bucket in range(4):
            hits = store.query(TaskQuery(statuses=frozenset({status}), buckets=frozenset({bucket})))
            for hit in hits:
                assert (hit.status, hit.bucket) == (status, bucket), hit
                indexed[hit.task_id] += 1
    assert indexed == Counter(set(stored_tasks)), "a task is in no index or in two"
    by_status = Counter(t.status for t in stored_tasks.values())
    assert store.counts() == {s: by_status.get(s, 0) for s in TaskStatus}
    raw_counts = {
        k.decode(): int(v) for k, v in client.hgetall(store.keys.counts).items() if int(v) != 0
    }
    expected_counts = {s.value: n for s, n in by_status.items()}
    expected_counts.update(Counter(f"{t.status.value}:{t.bucket}" for t in stored_tasks.values()))
    assert raw_counts == expected_counts

    # History: every acked append is there, with what was sent.
    history_checked = 0
    for r in acked:
        if r["op"] == "append":
            entries = {h.version: h for h in store.history(r["task"])}
            assert r["version"] in entries, f"acknowledged append lost: {r}"
            assert entries[r["version"]].to_status.value == r["to"], (r, entries[r["version"]])
            history_checked += 1
    appended_unknown = {(r["task"], r["version"]) for r in unknown if r["op"] == "append"}
    acked_appends = {(r["task"], r["version"]) for r in acked if r["op"] == "append"}
    for task_id in written:
        for h in store.history(task_id):
            key = (task_id, h.version)
            assert key in acked_appends or key in appended_unknown, f"unexplained entry {key}"

    # Commands: an acked claim is still leased (lease_until >= acked) or finished; an acked
    # completion is finished with its outcome; each command is in exactly one of queue and
    # leases while unfinished, in neither once finished.
    queue = {m.decode() for m in client.zrange(store.keys.command_queue, 0, -1)}
    leases = {
        m.decode(): int(s)
        for m, s in client.zrange(store.keys.command_leases, 0, -1, withscores=True)
    }
    acked_lease: dict[str, int] = {}
    claimers: Counter[str] = Counter()
    for r in acked:
        if r["op"] == "claim":
            for cid, until in r["cmds"]:
                acked_lease[cid] = until
                claimers[cid] += 1
    assert not [c for c, n in claimers.items() if n > 1], "a command was claimed twice"
    completed = {r["cid"]: r["by"] for r in acked if r["op"] == "complete"}
    leased_held = finished = 0
    unexplained_leases = 0
    unexplained_finishes: set[str] = set()
    for c in commands:
        stored = raw_command(store, client, c.command_id)
        cid = c.command_id
        if stored.finished_at is not None:
            assert cid not in queue and cid not in leases, cid
            if cid in completed:
                assert stored.outcome == completed[cid], stored
                finished += 1
            else:
                unexplained_finishes.add(cid)
        else:
            assert cid not in completed, f"acknowledged completion lost: {cid}"
            assert (cid in queue) != (cid in leases), f"{cid} in queue and leases disagree"
            if cid in leases:
                assert stored.lease_until is not None
                assert leases[cid] == encode_dt(stored.lease_until), cid
                if cid not in acked_lease:
                    unexplained_leases += 1
        if cid in acked_lease and stored.finished_at is None:
            assert stored.lease_until is not None, f"acknowledged lease lost: {cid}"
            assert encode_dt(stored.lease_until) >= acked_lease[cid], cid
            leased_held += 1
    # Whatever was found beyond the acknowledged is explained by an indeterminate op.
    unknown_ops = Counter(r["op"] for r in unknown)
    assert unexplained_finishes <= {r["cid"] for r in unknown if r["op"] == "complete"}
    assert unexplained_leases <= 2 * unknown_ops["claim"]  # limit=2 per claim

    # The fate of each indeterminate op (RELIABILITY fact 3: a write whose reply was lost may
    # have been applied; either way it is all or nothing, as checked above).
    fates = []
    for r in unknown:
        if r["op"] in ("create", "save"):
            got = store.get(r["task"])
            done = got is not None and got.status_version == r["version"]
        elif r["op"] == "append":
            done = r["version"] in {h.version for h in store.history(r["task"])}
        elif r["op"] == "complete":
            done = r["cid"] in unexplained_finishes
        else:
            done = unexplained_leases > 0
        fates.append(f"{r['op']}:{'applied' if done else 'not applied'}")
    return {
        "fates": fates,
        "tasks": len(stored_tasks),
        "versions_checked": sum(
            1 for r in acked if r["op"] == "save" and r["task"] in stored_tasks
        ),
        "history": history_checked,
        "leased": leased_held,
        "finished": finished,
    }
