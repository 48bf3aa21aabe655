"""Worker pools: ``BucketPolicy``, ``rendezvous`` and ``BucketPool`` on a real redis-server.

1. Pure functions: the key -> bucket hash is pinned (a change of hash breaks these tests) and the
   same in another interpreter with another hash seed; rendezvous is deterministic, balanced
   within one, and a join or a leave moves only the buckets the joiner gains or the leaver had.
2. In-process pools driven by explicit ``tick()`` calls: convergence to a partition within two
   rounds, a dead worker's buckets move after its lease and not before, a clean leave hands over
   at once, two controllers serving the same bucket never both start a task (the CAS), and a
   ``num_buckets`` mismatch stops a controller before it runs anything.
3. Real worker processes (``python -m chongming_redis.cli worker``), marked ``slow``: 3 workers
   and 600 tasks, each started once, by the owner of its bucket; SIGKILL of one worker mid-run
   (bucket move time measured and printed; its tasks LOST, retried, all SUCCEEDED; no attempt
   started twice), on Redis, on a SQLite file and on PostgreSQL (``--store``); a 4th worker
   joining takes a quarter of the buckets and nothing else moves; a worker with another
   ``--num-buckets`` exits with one line. A task function records each start in a file
   (``pool_app``), independent of the store.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.embedded.workers import WorkerProcesses
from chongming_redis.errors import StoreError
from chongming_redis.model import TaskQuery, TaskStatus, Transition
from chongming_redis.runtime.app import App
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.pool import BucketPool, rendezvous
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.support.store_targets import WITH_VALKEY, StoreTarget

ROOT = Path(__file__).resolve().parents[1]
NUM_BUCKETS = 16
POOL_APP = "tests.support.pool_app:app"


# -- helpers ----------------------------------------------------------------------------------


def owners_of(assignment: dict[str, frozenset[int]]) -> dict[int, str]:
    return {b: w for w, buckets in assignment.items() for b in buckets}


def settle(members: list[str], num_buckets: int) -> dict[int, str]:
    """The assignment a pool of ``members`` settles on when they start one after another."""
    current: dict[int, str] = {}
    for n in range(1, len(members) + 1):
        current = owners_of(rendezvous(members[:n], num_buckets, current))
    return current


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def starts_per_attempt(history: list[Transition]) -> Counter[tuple[str, int]]:
    """``{(worker, attempt): starts}`` from the ``PENDING -> RUNNING`` entries, whose reason is
    ``"started by <owner> (attempt N)"``."""
    starts: Counter[tuple[str, int]] = Counter()
    for entry in history:
        if entry.from_status is TaskStatus.PENDING and entry.to_status is TaskStatus.RUNNING:
            reason = entry.reason or ""
            assert reason.startswith("started by ") and reason.endswith(")"), reason
            owner, _, attempt = reason[len("started by ") : -1].rpartition(" (attempt ")
            starts[(owner, int(attempt))] += 1
    return starts


def only_starts_enter_running(history: list[Transition]) -> bool:
    """No pause/resume in these runs: every transition into RUNNING is a start, so counting
    starts counts RUNNING transitions."""
    return all(
        e.from_status is TaskStatus.PENDING for e in history if e.to_status is TaskStatus.RUNNING
    )


def attempts_started(history: list[Transition]) -> Counter[int]:
    per_attempt: Counter[int] = Counter()
    for (_, attempt), n in starts_per_attempt(history).items():
        per_attempt[attempt] += n
    return per_attempt


# -- BucketPolicy -------------------------------------------------------------------------------


PINNED = {  # computed once from BLAKE2b-64 of the key's UTF-8 bytes; a change of hash breaks them
    (64, "user-1"): 8,
    (64, "user-2"): 8,
    (64, "a"): 47,
    (64, "order-42"): 51,
    (16, "user-1"): 8,
    (65536, "user-1"): 57736,
}


@pytest.mark.parametrize(("num_buckets", "key"), sorted(PINNED))
def test_bucket_for_is_pinned(num_buckets: int, key: str) -> None:
    assert BucketPolicy(num_buckets).bucket_for(key) == PINNED[(num_buckets, key)]


def test_bucket_for_is_the_same_in_another_process_with_another_hash_seed() -> None:
    keys = [f"user-{i}" for i in range(200)] + ["ключ", "键-1", "a b"]
    here = [BucketPolicy(64).bucket_for(k) for k in keys]
    code = (
        "import json, sys\n"
        "from chongming_redis.runtime.buckets import BucketPolicy\n"
        "keys = json.loads(sys.stdin.read())\n"
        "print(json.dumps([BucketPolicy(64).bucket_for(k) for k in keys]))\n"
    )
    for seed in ("0", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(keys),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        assert json.loads(out) == here


def test_bucket_for_spreads_keys_evenly() -> None:
    policy = BucketPolicy(64)
    counts = Counter(policy.bucket_for(f"key-{i}") for i in range(10_000))
    assert set(counts) == set(range(64))
    # 10k keys over 64 buckets: 156 per bucket, sd ~12.4; 5 sd either side never trips.
    assert min(counts.values()) >= 94 and max(counts.values()) <= 219, counts
    chi2 = sum((n - 10_000 / 64) ** 2 / (10_000 / 64) for n in counts.values())
    assert chi2 < 120, chi2  # 63 degrees of freedom: p < 1e-5 beyond 120


def test_bucket_policy_refuses_bad_values() -> None:
    for bad in (0, -1, 65537):
        with pytest.raises(ValueError, match="num_buckets"):
            BucketPolicy(bad)
    with pytest.raises((TypeError, ValueError)):
        BucketPolicy(64).bucket_for("")


# -- rendezvous ---------------------------------------------------------------------------------


def random_names(rng: random.Random, n: int) -> list[str]:
    return [f"host{rng.randrange(100)}-{rng.randrange(1, 4_000_000)}" for _ in range(n)]


def test_rendezvous_is_deterministic() -> None:
    workers = ["w-b", "w-a", "w-c"]
    one = rendezvous(workers, 64)
    assert one == rendezvous(list(reversed(workers)), 64) == rendezvous([*workers, "w-a"], 64)
    current = owners_of(one)
    assert rendezvous(workers, 64, current) == rendezvous(sorted(workers), 64, dict(current))
    assert rendezvous([], 64) == {}
    code = (
        "import json\n"
        "from chongming_redis.runtime.pool import rendezvous\n"
        "a = rendezvous(['w-b', 'w-a', 'w-c', 'w-d'], 64)\n"
        "print(json.dumps({w: sorted(b) for w, b in a.items()}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONHASHSEED": "7"},
    ).stdout
    here = rendezvous(["w-a", "w-b", "w-c", "w-d"], 64)
    assert json.loads(out) == {w: sorted(b) for w, b in here.items()}


@pytest.mark.parametrize("num_buckets", [1, 7, 16, 64, 100])
def test_rendezvous_is_a_partition_balanced_within_one(num_buckets: int) -> None:
    rng = random.Random(num_buckets)
    for n in range(1, 9):
        names = random_names(rng, n)
        for current in (None, settle(names, num_buckets)):
            shares = rendezvous(names, num_buckets, current)
            assert set(shares) == set(names)
            every = [b for s in shares.values() for b in s]
            assert sorted(every) == list(range(num_buckets))  # each bucket exactly once
            sizes = [len(s) for s in shares.values()]
            assert max(sizes) - min(sizes) <= 1, sizes


def test_a_settled_assignment_is_stable() -> None:
    rng = random.Random(1)
    for _ in range(50):
        names = random_names(rng, rng.randrange(1, 7))
        settled = settle(names, 64)
        assert owners_of(rendezvous(names, 64, settled)) == settled


def test_a_join_moves_about_a_quarter_and_only_to_the_newcomer() -> None:
    rng = random.Random(2)
    fractions = []
    for _ in range(100):
        names = random_names(rng, 4)
        before = settle(names[:3], 64)
        after = owners_of(rendezvous(names, 64, before))
        moved = [b for b in range(64) if before[b] != after[b]]
        fractions.append(len(moved) / 64)
        assert 0.15 <= len(moved) / 64 <= 0.35, len(moved)
        assert all(after[b] == names[3] for b in moved)  # nothing moves between the others
        for old in names[:3]:  # each one keeps all but what it gave the newcomer
            assert {b for b, w in after.items() if w == old} <= {
                b for b, w in before.items() if w == old
            }
    print(f"\n3->4 workers, 64 buckets: moved {min(fractions):.3f}..{max(fractions):.3f}")


def test_a_leave_moves_only_the_leavers_buckets() -> None:
    rng = random.Random(3)
    for num_buckets in (16, 64):
        for _ in range(50):
            names = random_names(rng, rng.randrange(2, 7))
            before = settle(names, num_buckets)
            leaver = rng.choice(names)
            rest = [w for w in names if w != leaver]
            after = owners_of(rendezvous(rest, num_buckets, before))
            moved = {b for b in range(num_buckets) if before[b] != after[b]}
            assert moved == {b for b, w in before.items() if w == leaver}
            sizes = Counter(after.values())
            assert max(sizes.values()) - min(sizes.values()) <= 1


def test_rendezvous_ignores_owners_that_are_not_members_and_buckets_out_of_range() -> None:
    members = ["a", "b"]
    current = {0: "ghost", 1: "a", 99: "a", 2: "b"}
    shares = rendezvous(members, 4, current)
    assert sorted(b for s in shares.values() for b in s) == [0, 1, 2, 3]
    assert 1 in shares["a"] and 2 in shares["b"]


# -- in-process pools on a real Redis -----------------------------------------------------------


def tiny_app() -> App:
    app = App("pool-unit")

    @app.task()
    def noop(ctx: TaskContext, params: Any) -> str:
        time.sleep(0.002)
        return ctx.owner

    return app


#: The controller each test pool serves (the pool itself knows only its ``on_change``).
_CONTROLLERS: dict[int, Controller] = {}


def controller_of(pool: BucketPool) -> Controller:
    return _CONTROLLERS[id(pool)]


@pytest.fixture
def make_pool(redis_proc: RedisProc, namespace: str) -> Iterator[Callable[..., BucketPool]]:
    """``make_pool(name, worker_lease=..., num_buckets=...)``: a controller (not started) that
    joined the namespace's pool; its own store connection."""
    stores: list[RedisTaskStore] = []

    def make(name: str, *, worker_lease: float = 5.0, num_buckets: int = NUM_BUCKETS) -> BucketPool:
        store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
        stores.append(store)
        controller = Controller(
            store, app=tiny_app(), owner=name, buckets=BucketPolicy(num_buckets)
        )
        pool = controller.join_pool(worker_lease=worker_lease)
        _CONTROLLERS[id(pool)] = controller
        return pool

    yield make
    for store in stores:
        store.close()


def round_of_ticks(pools: list[BucketPool]) -> None:
    for pool in pools:
        pool.tick()


def assert_partition(store: RedisTaskStore, pools: list[BucketPool]) -> dict[int, str]:
    _, owners = store.pool_state()
    assert sorted(owners) == list(range(NUM_BUCKETS))
    assert set(owners.values()) == {p.owner for p in pools}
    for pool in pools:
        mine = frozenset(b for b, w in owners.items() if w == pool.owner)
        assert pool.held == mine
        assert controller_of(pool).serve_buckets == mine  # the starter serves exactly these
    sizes = Counter(owners.values()).values()
    assert max(sizes) - min(sizes) <= 1
    return owners


@pytest.mark.redis
def test_pool_converges_to_a_partition_within_two_rounds(
    make_pool: Callable[..., BucketPool],
) -> None:
    pools = [make_pool(f"w{i}") for i in range(3)]
    assert all(controller_of(p).serve_buckets == frozenset() for p in pools)  # none before a tick
    round_of_ticks(pools)
    round_of_ticks(pools)
    owners = assert_partition(pools[0].store, pools)
    for _ in range(3):  # and stays put
        round_of_ticks(pools)
    assert pools[0].store.pool_state()[1] == owners
    workers, _ = pools[0].store.pool_state()
    assert set(workers) == {"w0", "w1", "w2"}
    assert all(until > datetime.now(timezone.utc) for until in workers.values())


@pytest.mark.redis
def test_a_dead_workers_buckets_move_after_its_lease_and_not_before(
    make_pool: Callable[..., BucketPool],
) -> None:
    lease = 1.0
    a, b, c = (make_pool(name, worker_lease=lease) for name in ("wa", "wb", "wc"))
    for _ in range(2):
        round_of_ticks([a, b, c])
    before = assert_partition(a.store, [a, b, c])
    dead = {x for x, w in before.items() if w == "wc"}
    t0 = time.monotonic()
    c.tick()  # c's last heartbeat: from now on it is "dead" (never ticks again)
    moved_at = None
    while time.monotonic() - t0 < 3 * lease:
        started = time.monotonic()
        a.tick()
        b.tick()
        owners = a.store.pool_state()[1]
        if started - t0 < lease * 0.8:  # before its lease expired: nobody touches its buckets
            assert {x for x, w in owners.items() if w == "wc"} == dead
            assert a.held | b.held == frozenset(set(range(NUM_BUCKETS)) - dead)
        if moved_at is None and not any(w == "wc" for w in owners.values()):
            moved_at = started - t0
            break
        time.sleep(0.05)
    assert moved_at is not None, "the dead worker's buckets never moved"
    print(f"\ndead worker's {len(dead)} buckets moved {moved_at:.3f}s after its last tick")
    assert lease - 0.05 <= moved_at <= 2 * lease
    after = assert_partition(a.store, [a, b])
    assert {x for x in range(NUM_BUCKETS) if after[x] != before[x]} == dead  # only its buckets
    assert "wc" not in a.store.pool_state()[0]
    # It comes back (a long pause, not a crash): it serves nothing until it is granted buckets
    # again, and the three converge again.
    c.tick()
    assert c.held == frozenset() and controller_of(c).serve_buckets == frozenset()
    for _ in range(2):
        round_of_ticks([a, b, c])
    assert_partition(a.store, [a, b, c])


@pytest.mark.redis
def test_a_clean_leave_hands_over_at_once_and_moves_only_its_buckets(
    make_pool: Callable[..., BucketPool],
) -> None:
    a, b, c = (make_pool(name) for name in ("la", "lb", "lc"))  # 5 s leases: no expiry here
    for _ in range(2):
        round_of_ticks([a, b, c])
    before = assert_partition(a.store, [a, b, c])
    c.stop()  # releases everything and unregisters
    assert "lc" not in a.store.pool_state()[0]
    assert not any(w == "lc" for w in a.store.pool_state()[1].values())
    round_of_ticks([a, b])
    after = assert_partition(a.store, [a, b])
    assert {x for x in range(NUM_BUCKETS) if after[x] != before[x]} == {
        x for x, w in before.items() if w == "lc"
    }


@pytest.mark.redis
def test_a_join_moves_only_to_the_newcomer(make_pool: Callable[..., BucketPool]) -> None:
    pools = [make_pool(f"j{i}") for i in range(3)]
    for _ in range(2):
        round_of_ticks(pools)
    before = assert_partition(pools[0].store, pools)
    pools.append(make_pool("j3"))
    for _ in range(2):
        round_of_ticks(pools)
    after = assert_partition(pools[0].store, pools)
    moved = {x for x in range(NUM_BUCKETS) if after[x] != before[x]}
    assert moved == {x for x, w in after.items() if w == "j3"}
    assert len(moved) == NUM_BUCKETS // 4


@pytest.mark.redis
def test_two_controllers_serving_the_same_bucket_never_both_start_a_task(
    redis_proc: RedisProc, namespace: str
) -> None:
    policy = BucketPolicy(NUM_BUCKETS)
    bucket = policy.bucket_for("shared")
    keys = [k for k in (f"k-{i}" for i in range(20_000)) if policy.bucket_for(k) == bucket][:200]
    other_keys = [k for k in (f"o-{i}" for i in range(200)) if policy.bucket_for(k) != bucket][:5]
    assert len(keys) == 200
    stores = [RedisTaskStore.from_url(redis_proc.url, namespace=namespace) for _ in range(3)]
    client = Controller(stores[2], app=tiny_app(), owner="submitter", buckets=policy)
    ids = [client.submit("noop", key=k) for k in keys]
    others = [client.submit("noop", key=k) for k in other_keys]
    controllers = [
        Controller(
            stores[i],
            app=tiny_app(),
            owner=f"racer{i}",
            buckets=policy,
            concurrency=8,
            start_poll_interval=0.02,
            command_poll_interval=0.2,
            reconcile_interval=60,
        )
        for i in range(2)
    ]
    try:
        for controller in controllers:
            controller.serve({bucket})  # both believe they own it
        barrier = threading.Barrier(2)

        def go(controller: Controller) -> None:
            barrier.wait()
            controller.start()

        threads = [threading.Thread(target=go, args=(c,)) for c in controllers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)

        def all_done() -> bool:
            return stores[2].counts()[TaskStatus.SUCCEEDED] == len(ids)

        wait_until(all_done, 60, "200 tasks to succeed")
        started_by: Counter[str] = Counter()
        for task_id in ids:
            snapshot = stores[2].get(task_id)
            assert snapshot is not None and snapshot.status is TaskStatus.SUCCEEDED
            history = stores[2].history(task_id)
            assert only_starts_enter_running(history)
            starts = starts_per_attempt(history)
            assert sum(starts.values()) == 1, (task_id, starts)  # one start, ever
            ((owner, attempt),) = starts
            assert attempt == 1 and snapshot.result == owner  # and that one ran it
            started_by[owner] += 1
        print(f"\nstarts per controller: {dict(started_by)}")
        assert set(started_by) == {"racer0", "racer1"}  # both really competed
        for task_id in others:  # a bucket nobody serves is left alone
            snapshot = stores[2].get(task_id)
            assert snapshot is not None and snapshot.status is TaskStatus.PENDING
    finally:
        for controller in controllers:
            controller.shutdown(grace=5)
        for store in stores:
            store.close()


@pytest.mark.redis
def test_num_buckets_mismatch_refuses_before_running_anything(
    make_pool: Callable[..., BucketPool], redis_proc: RedisProc, namespace: str
) -> None:
    first = make_pool("first", num_buckets=NUM_BUCKETS)
    first.tick()  # records num_buckets=16 for the namespace
    other = make_pool("other", num_buckets=8)
    controller = controller_of(other)
    task_id = controller.submit("noop", key="k")  # a task the refused worker could have run
    with pytest.raises(StoreError) as raised:
        other.tick()
    message = str(raised.value)
    assert f"num_buckets={NUM_BUCKETS}" in message and "8" in message and namespace in message
    with pytest.raises(StoreError, match="num_buckets"):
        controller.start()
    time.sleep(0.3)
    snapshot = controller.get(task_id)
    assert snapshot is not None and snapshot.status is TaskStatus.PENDING
    workers, owners = first.store.pool_state()
    assert set(workers) == {"first"} and set(owners.values()) == {"first"}
    running = [t.name for t in threading.enumerate() if t.name.startswith("other-")]
    assert running == []  # no starter, no pool loop, no task thread
    meta = redis_proc.client().hget(f"{{{namespace}}}:meta", "num_buckets")
    assert meta == str(NUM_BUCKETS).encode()


# -- real worker processes ----------------------------------------------------------------------


class Workers(WorkerProcesses):
    """``chongming-redis worker`` processes started by this test, named by their pool owner
    name; ``close`` ends every one of them, by pid."""

    def __init__(self, target: StoreTarget, tmp: Path) -> None:
        super().__init__(POOL_APP, target.url, target.namespace, logdir=tmp, cwd=ROOT)
        self.flags = target.flags

    def start(self, *extra: str, num_buckets: int = NUM_BUCKETS) -> str:
        options = ["--concurrency=4", f"--num-buckets={num_buckets}", "--task-lease=2",
                   "--worker-lease=2", "--grace=2", *self.flags, *extra]  # fmt: skip
        return self.owner(self.spawn(options))

    def stderr(self) -> str:
        return self.logs()

    def kill9(self, name: str) -> None:  # type: ignore[override]  (by owner name)
        super().kill9(int(name.rsplit("-", 1)[1]))

    def close(self) -> None:
        self.stop_all(timeout=15)


@pytest.fixture
def pool_env(target: StoreTarget, tmp_path: Path) -> Iterator[tuple[Workers, Any, Controller]]:
    workers = Workers(target, tmp_path)
    store = target.open()
    from tests.support.pool_app import app

    client = Controller(store, app=app, owner="test-client", buckets=BucketPolicy(NUM_BUCKETS))
    try:
        yield workers, store, client
    finally:
        workers.close()
        store.close()


def settled_owners(store: Any, names: set[str]) -> dict[int, str] | None:
    """The owners map if ``names`` (exactly) are live and share all buckets within one."""
    workers, owners = store.pool_state()
    now = datetime.now(timezone.utc)
    live = {w for w, until in workers.items() if until > now}
    if live != names or sorted(owners) != list(range(NUM_BUCKETS)):
        return None
    if set(owners.values()) != names:
        return None
    sizes = Counter(owners.values()).values()
    return owners if max(sizes) - min(sizes) <= 1 else None


def wait_settled(store: Any, names: set[str], timeout: float = 30) -> dict[int, str]:
    """Settled, and unchanged over 1.5 s (more than two pool ticks of a 2 s worker lease)."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        owners = settled_owners(store, names)
        if owners is None or owners != last:
            last, since = owners, time.monotonic()
        elif time.monotonic() - since >= 1.5:
            return owners
        time.sleep(0.05)
    raise AssertionError(f"pool of {sorted(names)} did not settle: {store.pool_state()}")


def submit_work(client: Controller, runs: Path, n: int, ms: int) -> list[str]:
    params = {"ms": ms, "runs_file": str(runs)}
    return [client.submit("work", params, key=f"user-{i}") for i in range(n)]


def runs_of(runs: Path) -> Counter[tuple[str, int]]:
    """``{(task id, attempt): times the task function began}`` from the pool_app's record."""
    rows = [line.split() for line in runs.read_text().splitlines()] if runs.exists() else []
    return Counter((task_id, int(attempt)) for task_id, attempt, _ in rows)


def all_succeeded(store: Any, n: int) -> bool:
    return store.counts()[TaskStatus.SUCCEEDED] == n


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(90)
def test_three_workers_run_600_tasks_each_started_once_mostly_by_its_buckets_owner(
    pool_env: tuple[Workers, Any, Controller], tmp_path: Path
) -> None:
    workers, store, client = pool_env
    names = {workers.start() for _ in range(3)}
    owners = wait_settled(store, names)
    t0 = time.monotonic()
    ids = submit_work(client, tmp_path / "runs.txt", 600, 5)
    wait_until(lambda: all_succeeded(store, 600), 60, "600 tasks to succeed: " + workers.stderr())
    elapsed = time.monotonic() - t0
    runs = runs_of(tmp_path / "runs.txt")
    per_worker: Counter[str] = Counter()
    by_owner = 0
    for task_id in ids:
        snapshot = store.get(task_id)
        assert snapshot is not None
        assert snapshot.status is TaskStatus.SUCCEEDED and snapshot.attempt == 1
        history = store.history(task_id)
        assert only_starts_enter_running(history)
        starts = starts_per_attempt(history)
        assert sum(starts.values()) == 1, (task_id, starts)
        ((owner, attempt),) = starts
        assert attempt == 1
        per_worker[owner] += 1
        by_owner += owner == owners[snapshot.bucket]
    assert runs == Counter({(task_id, 1): 1 for task_id in ids})  # each function ran once
    # Buckets keep their owners for the common path; a worker whose buckets ran dry takes due
    # work from the others' (work conservation), never a task twice.
    assert by_owner >= 300, by_owner
    assert store.pool_state()[1] == owners  # no bucket moved during the run
    print(f"\n600 tasks on 3 workers in {elapsed:.1f}s; starts per worker {dict(per_worker)}, "
          f"{by_owner} by the bucket's owner")  # fmt: skip
    assert set(per_worker) == names


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", WITH_VALKEY, indirect=True)
def test_sigkill_of_a_worker_moves_its_buckets_and_its_tasks_are_retried(
    pool_env: tuple[Workers, Any, Controller], target: StoreTarget, tmp_path: Path
) -> None:
    """On every store (Redis, a SQLite file, PostgreSQL, Redis Cluster, Valkey): the workers
    are ``chongming-redis worker`` processes given its URL, and nothing in the runtime needs
    Redis."""
    worker_lease = 2.0
    workers, store, client = pool_env
    names = {workers.start() for _ in range(3)}
    before = wait_settled(store, names)
    ids = submit_work(client, tmp_path / "runs.txt", 600, 80)

    def victim_busy() -> str | None:
        if store.counts()[TaskStatus.SUCCEEDED] < 60:
            return None  # mid-run, not at the very start
        running = Counter(
            t.lease_owner for t in store.query(TaskQuery(statuses=frozenset({TaskStatus.RUNNING})))
        )
        busy = [w for w in sorted(names) if running[w] >= 2]
        return busy[0] if busy else None

    victim = wait_until(victim_busy, 30, "a worker running tasks mid-run")
    victim_buckets = {b for b, w in before.items() if w == victim}
    workers.kill9(victim)
    killed_at = time.monotonic()
    survivors = names - {victim}

    def buckets_moved() -> dict[int, str] | None:
        owners = store.pool_state()[1]
        if sorted(owners) == list(range(NUM_BUCKETS)) and set(owners.values()) == survivors:
            return owners
        return None

    after = wait_until(buckets_moved, 4 * worker_lease, "the buckets to move", step=0.02)
    move_time = time.monotonic() - killed_at
    print(f"\n{target.kind}: SIGKILL {victim}: its {len(victim_buckets)} buckets moved in "
          f"{move_time:.2f}s (worker lease {worker_lease}s)")  # fmt: skip
    assert move_time <= 2 * worker_lease
    # Minimal movement: only the victim's buckets moved; the survivors kept theirs.
    assert {b for b in range(NUM_BUCKETS) if after[b] != before[b]} == victim_buckets
    sizes = Counter(after.values()).values()
    assert max(sizes) - min(sizes) <= 1

    wait_until(lambda: all_succeeded(store, 600), 70, "every task to succeed: " + workers.stderr())
    runs = runs_of(tmp_path / "runs.txt")
    lost, two_starts = [], []
    for task_id in ids:
        snapshot = store.get(task_id)
        assert snapshot is not None and snapshot.status is TaskStatus.SUCCEEDED
        history = store.history(task_id)
        assert only_starts_enter_running(history)
        per_attempt = attempts_started(history)
        if any(n > 1 for n in per_attempt.values()):
            two_starts.append((task_id, per_attempt))
        assert set(per_attempt) == set(range(1, snapshot.attempt + 1))
        for entry in history:
            if entry.to_status is TaskStatus.LOST:
                lost.append(task_id)
                assert entry.from_status is TaskStatus.RUNNING
                assert f"lease of {victim} expired" in (entry.reason or "")
        if snapshot.attempt > 1:  # the retry runs on a survivor
            assert task_id in lost
            last_start = [o for (o, a) in starts_per_attempt(history) if a == snapshot.attempt]
            assert last_start and last_start[0] in survivors
    assert two_starts == []
    assert max(runs.values()) == 1  # no attempt's function began twice
    assert lost, "the killed worker held running tasks, some must have been LOST"
    print(f"LOST and retried: {len(lost)} tasks; starts per attempt: at most 1")


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(90)
def test_a_fourth_worker_takes_a_quarter_and_nothing_else_moves(
    pool_env: tuple[Workers, Any, Controller],
) -> None:
    workers, store, _ = pool_env
    names = {workers.start() for _ in range(3)}
    before = wait_settled(store, names)
    started = time.monotonic()
    fourth = workers.start()
    seen: dict[int, set[str]] = {b: {w} for b, w in before.items()}

    def observe() -> dict[int, str] | None:
        _, owners = store.pool_state()
        for b, w in owners.items():
            seen[b].add(w)
        return settled_owners(store, names | {fourth})

    wait_until(observe, 30, "the 4th worker to get its share", step=0.02)
    join_time = time.monotonic() - started  # includes the process start-up (imports)
    after = wait_settled(store, names | {fourth})
    gained = {b for b, w in after.items() if w == fourth}
    moved = {b for b in range(NUM_BUCKETS) if after[b] != before[b]}
    print(f"\n4th worker: gained {len(gained)} of {NUM_BUCKETS} buckets, {len(moved)} moved, "
          f"settled {join_time:.2f}s after its start")  # fmt: skip
    assert 3 <= len(gained) <= 5
    assert moved == gained  # the others lost exactly what it gained
    for old in names:
        assert {b for b, w in after.items() if w == old} <= {
            b for b, w in before.items() if w == old
        }
    # Not even transiently did a bucket pass between two of the old workers.
    assert all(seen[b] <= {before[b], fourth} for b in range(NUM_BUCKETS)), seen


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(90)
def test_a_worker_with_another_num_buckets_exits_with_one_line(
    pool_env: tuple[Workers, Any, Controller], target: StoreTarget
) -> None:
    workers, store, _ = pool_env
    running = workers.start()
    wait_settled(store, {running})
    result = subprocess.run(
        [sys.executable, "-m", "chongming_redis.cli", "worker", POOL_APP, *target.cli_args(),
         "--num-buckets=8"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == errors[0]
    assert "num_buckets=16" in errors[0] and "8" in errors[0], errors[0]
    print(f"\n{errors[0]}")
    # The running worker is undisturbed and the refused one never registered.
    assert settled_owners(store, {running}) is not None
