"""Differential stateful test: ``RedisTaskStore`` against the reference ``InMemoryTaskStore``.

A Hypothesis ``RuleBasedStateMachine`` drives random sequences of all 14 protocol operations
against both stores at once and asserts after every call that both gave the same answer: the
same return value (compared strictly, type by type: ``1`` is not ``1.0``, a datetime's timezone
counts, a frozenset is compared as a set), or the same exception type with the same message.
After every step the invariants compare ``counts()``, ``get(id)`` and ``history(id)`` for every
id of the pool and the whole ``query()``. At the end of each example every unfinished command
is drained with one claim far in the future (the only way to read commands back), and both
stores are closed twice and must refuse every method with ``StoreClosed``.

Small pools (5 task ids, 5 command ids, a few names, tags, buckets and pipelines, with awkward
members like ``a:b``, ``{x}``, ``*``, ``ü``) make collisions, replays, ties in ``created_at``
and index moves frequent. Times come from a logical clock the machine advances by random
amounts; ``claim_commands``, ``complete_command`` and ``release_command`` use it as ``now``.

The machine also shrinks the store's paging constants (``QUERY_PAGE``, ``QUERY_BUDGET``,
``PRUNE_BATCH``) per example, so the cursor continuation of ``query`` and the batch loop of
``prune`` run with pages of one or two entries, not only in the single-page case.

Runs against a real redis-server 7 (a fresh namespace per example on the session server) and,
with fewer examples, against fakeredis (legacy script mode).
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import fakeredis
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from chongming_redis import (
    Command,
    CommandKind,
    Failure,
    InMemoryTaskStore,
    Progress,
    StoreClosed,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores import redis as redis_module
from chongming_redis.stores.protocol import PROTOCOL_METHODS, TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

pytestmark = pytest.mark.redis

T0 = datetime(2024, 3, 10, 12, 0, 0, tzinfo=timezone.utc)
FAR_FUTURE = datetime(2200, 1, 1, tzinfo=timezone.utc)

TASK_IDS = ("t1", "a:b", "{x}", "ü", "*")
COMMAND_IDS = ("c1", "c:2", "{c}", "ç", "*")
UNKNOWN_COMMAND = "never-submitted"
NAMES = ("job", "job.a", "jo", "ü-name", "j*b", "[x")
NAME_PREFIXES = ("j", "jo", "job", "job.", "ü", "[", "j*", "zz")
TAGS = ("io", "ios", "a:b", "紧急", "*")
BUCKETS = (0, 1, 7)
PIPELINES = ("p1", "p:2", "{p}")
OWNERS = ("w1", "w:2")
TZS = (
    timezone.utc,
    timezone(timedelta(hours=5, minutes=45)),
    timezone(timedelta(hours=-8)),
)

#: The paging constants of the Redis store, restored after every example.
DEFAULT_LIMITS = {
    "QUERY_PAGE": redis_module.QUERY_PAGE,
    "QUERY_BUDGET": redis_module.QUERY_BUDGET,
    "PRUNE_BATCH": redis_module.PRUNE_BATCH,
}


# -- strategies --------------------------------------------------------------------------------


def _moment(seconds: int, micros: int, tz: timezone) -> datetime:
    return (T0 + timedelta(seconds=seconds, microseconds=micros)).astimezone(tz)


#: Instants in a narrow window (frequent ties), written in various timezones.
moments = st.builds(
    _moment, st.integers(0, 6), st.sampled_from((0, 0, 1, 999_999)), st.sampled_from(TZS)
)
#: Instants spread over the first minutes of the logical clock (lease ends, heartbeats).
later_moments = st.builds(
    _moment, st.integers(0, 240), st.sampled_from((0, 1, 500_000)), st.sampled_from(TZS)
)
texts = st.text(max_size=6)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(width=64)
    | texts
    | st.binary(max_size=6)
)
payloads = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
numbers = st.integers(-(2**53) + 1, 2**53 - 1) | st.floats(allow_nan=False, allow_infinity=False)
progresses = st.none() | st.builds(Progress, numbers, st.none() | numbers, st.none() | texts)
failures = st.none() | st.builds(
    Failure,
    st.sampled_from(("ValueError", "E:x")),
    texts,
    st.none() | st.text(max_size=12),
)
statuses = st.sampled_from(tuple(TaskStatus))
# A WAITING task needs parents and the stores' dependencies duty: its own tests have it.
snapshot_statuses = st.sampled_from(tuple(s for s in TaskStatus if s is not TaskStatus.WAITING))
transitions = st.builds(
    Transition,
    task_id=st.sampled_from(TASK_IDS),
    version=st.integers(1, 6),
    from_status=st.none() | statuses,
    to_status=statuses,
    at=later_moments,
    reason=st.none() | texts,
)


@st.composite
def snapshot_fields(draw: st.DrawFn) -> dict[str, Any]:
    """Every field of a snapshot except ``task_id`` and ``status_version``."""
    return {
        "name": draw(st.sampled_from(NAMES)),
        "status": draw(snapshot_statuses),
        "created_at": draw(moments),
        "updated_at": draw(later_moments),
        "tags": draw(st.frozensets(st.sampled_from(TAGS), max_size=3)),
        "bucket": draw(st.sampled_from(BUCKETS)),
        "key": draw(st.none() | st.sampled_from(("k", "k:1", "ü"))),
        "pipeline_run_id": draw(st.none() | st.sampled_from(PIPELINES)),
        "params": draw(payloads),
        "result": draw(payloads),
        "progress": draw(progresses),
        "failure": draw(failures),
        "heartbeat_at": draw(st.none() | later_moments),
        # save never writes the lease; create is the reference's "write the whole task"
        "lease_owner": draw(st.none() | st.sampled_from(OWNERS)),
        "lease_until": draw(st.none() | later_moments),
        "attempt": draw(st.integers(0, 3)),
        "not_before": draw(st.none() | later_moments),
        "priority": draw(st.integers(-100, 100)),
    }


queries = st.builds(
    TaskQuery,
    statuses=st.none() | st.frozensets(statuses, max_size=3),
    name=st.none() | st.sampled_from(NAMES),
    name_prefix=st.none() | st.sampled_from(NAME_PREFIXES),
    tag=st.none() | st.sampled_from((*TAGS, "i")),
    buckets=st.none() | st.frozensets(st.sampled_from((*BUCKETS, 99)), max_size=3),
    pipeline_run_id=st.none() | st.sampled_from(PIPELINES),
    limit=st.none() | st.integers(0, 6),
    newest_first=st.booleans(),
)

commands = st.builds(
    Command,
    command_id=st.sampled_from(COMMAND_IDS),
    task_id=st.sampled_from(TASK_IDS),
    kind=st.sampled_from(tuple(CommandKind)),
    created_at=moments,
    issued_by=st.none() | st.sampled_from(("ops", "a:b")),
    payload=payloads,
    lease_until=st.none() | later_moments,
    finished_at=st.sampled_from((None, None, None, T0 + timedelta(seconds=9))),
    outcome=st.none() | texts,
)

#: Mostly valid; 0, -1 and more than a week are refused by both with the same ValueError.
lease_seconds = st.one_of(
    st.sampled_from((1e-6, 0.25, 1, 5, 30, 60)),
    st.floats(min_value=1e-6, max_value=300),
    st.sampled_from((1, 5, 30, 60, 90, 0, -1, 7 * 24 * 3600.0 + 1)),
)
#: Mostly valid; 0 and 1001 are refused by both.
#: Mostly (3 in 4) "pick an existing record", else the drawn id, which may be unknown.
picks = st.integers(0, 15)


def _pick(pick: int, existing: list[str], drawn: str) -> str:
    return existing[pick % len(existing)] if existing and pick < 12 else drawn


claim_limits = st.sampled_from((1, 1, 2, 2, 3, 5, 50, 50, 1000, 0, 1001))
#: Mostly valid; -1 is refused by both (since_version, keep_terminal).
small_counts = st.sampled_from((0, 0, 1, 1, 2, 3, 5, -1))


# -- comparing results ----------------------------------------------------------------------


def norm(value: Any) -> Any:
    """A strict, comparable form: types are part of it (``1`` is not ``1.0``, ``b"x"`` is not
    ``"x"``, a list is not a tuple), datetimes compare by ``repr`` (instant and timezone),
    sets compare as sets."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value).__name__, tuple((f.name, norm(getattr(value, f.name))) for f in fields))
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.value)
    if isinstance(value, datetime):
        return ("datetime", repr(value))
    if isinstance(value, frozenset | set):
        return (type(value).__name__, tuple(sorted(repr(norm(v)) for v in value)))
    if isinstance(value, dict):
        return ("dict", tuple((norm(k), norm(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(norm(v) for v in value))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def _shape(normal: Any) -> str:
    """A coarse label of a normalised result, to count what the runs reached."""
    kind, value = normal
    if kind in ("list", "dict"):
        if not value:
            return f"empty {kind}"
        return f"{kind} of {min(len(value), 3)}{'+' if len(value) >= 3 else ''}"
    if kind == "int":
        return "int 0" if value == 0 else "int > 0"
    return kind


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    try:
        return ("returned", norm(fn(*args, **kwargs)))
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))


# -- the machine ----------------------------------------------------------------------------


class StoreParity(RuleBasedStateMachine):
    """Both stores, driven in lock step. Subclasses set ``factory`` (the store under test)."""

    factory: ClassVar[Callable[[], TaskStore]]
    seen: ClassVar[Counter[str]]  # outcome labels over all examples of one run

    def __init__(self) -> None:
        super().__init__()
        self.subject = type(self).factory()
        self.reference = InMemoryTaskStore()
        self.clock_us = 0
        self.submitted: list[str] = []  # command ids, in the order they were stored
        self.steps = 0
        self.closed = False

    # -- helpers ---------------------------------------------------------------------------

    def both(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self.steps += 1
        got = outcome(getattr(self.subject, method), *args, **kwargs)
        want = outcome(getattr(self.reference, method), *args, **kwargs)
        assert got == want, (
            f"{method}(*{args!r}, **{kwargs!r}) differs:\n  redis:  {got!r}\n  memory: {want!r}"
        )
        self.seen[f"{method}: {want[1] if want[0] == 'raised' else _shape(want[1])}"] += 1
        return want

    def now(self) -> datetime:
        return T0 + timedelta(microseconds=self.clock_us)

    def current_version(self, task_id: str) -> int | None:
        if self.closed:
            return None
        task = self.reference.get(task_id)
        return None if task is None else task.status_version

    # -- setup -----------------------------------------------------------------------------

    @initialize(
        page=st.sampled_from((1, 2, 3, DEFAULT_LIMITS["QUERY_PAGE"])),
        budget=st.sampled_from((1, 2, 5, DEFAULT_LIMITS["QUERY_BUDGET"])),
        batch=st.sampled_from((1, 2, DEFAULT_LIMITS["PRUNE_BATCH"])),
    )
    def paging(self, page: int, budget: int, batch: int) -> None:
        """Tiny pages and batches exercise the query cursor and the prune loop."""
        redis_module.QUERY_PAGE = page
        redis_module.QUERY_BUDGET = budget
        redis_module.PRUNE_BATCH = batch

    @initialize(
        tasks=st.lists(
            st.tuples(st.sampled_from(TASK_IDS), st.integers(0, 3), snapshot_fields()),
            max_size=5,
        ),
        entries=st.lists(transitions, max_size=6),
        submitted=st.lists(commands, max_size=5),
    )
    def populate(
        self,
        tasks: list[tuple[str, int, dict[str, Any]]],
        entries: list[Transition],
        submitted: list[Command],
    ) -> None:
        """Start from a populated store, so most rules act on existing records."""
        for task_id, version, fields in tasks:
            self.both("create", TaskSnapshot(task_id=task_id, status_version=version, **fields))
        for entry in entries:
            self.both("append", entry)
        for command in submitted:
            self.submit_command(command)

    # -- task snapshots --------------------------------------------------------------------

    @rule(task_id=st.sampled_from(TASK_IDS), version=st.integers(0, 5), fields=snapshot_fields())
    def create(self, task_id: str, version: int, fields: dict[str, Any]) -> None:
        self.both("create", TaskSnapshot(task_id=task_id, status_version=version, **fields))

    @rule(
        task_id=st.sampled_from(TASK_IDS),
        pick=picks,
        right=st.sampled_from((True, True, False)),
        wrong=st.integers(0, 8),
        jump=st.sampled_from((1, 1, 1, 1, 2, 5, 0, -1)),  # 0, -1: "versions never go back"
        fields=snapshot_fields(),
    )
    def save(
        self, task_id: str, pick: int, right: bool, wrong: int, jump: int, fields: dict[str, Any]
    ) -> None:
        existing = [t for t in TASK_IDS if self.current_version(t) is not None]
        task_id = _pick(pick, existing, task_id)
        current = self.current_version(task_id)
        expect = current if right and current is not None else wrong
        version = max(0, expect + jump)
        snap = TaskSnapshot(task_id=task_id, status_version=version, **fields)
        self.both("save", snap, expect_version=expect)

    @rule(task_id=st.sampled_from(TASK_IDS))
    def get(self, task_id: str) -> None:
        self.both("get", task_id)

    @rule(query=st.none() | queries)
    def query(self, query: TaskQuery | None) -> None:
        self.both("query", query)

    @rule()
    def counts(self) -> None:
        self.both("counts")

    # -- history ---------------------------------------------------------------------------

    @rule(transition=transitions)
    def append(self, transition: Transition) -> None:
        self.both("append", transition)

    @rule(task_id=st.sampled_from(TASK_IDS), since=small_counts)
    def history(self, task_id: str, since: int) -> None:
        self.both("history", task_id, since_version=since)

    # -- touch -----------------------------------------------------------------------------

    @rule(
        task_id=st.sampled_from(TASK_IDS),
        progress=progresses,
        heartbeat_at=st.none() | later_moments,
        lease_owner=st.none() | st.sampled_from(OWNERS),
        lease_until=st.none() | later_moments,
    )
    def touch(
        self,
        task_id: str,
        progress: Progress | None,
        heartbeat_at: datetime | None,
        lease_owner: str | None,
        lease_until: datetime | None,
    ) -> None:
        given = {
            "progress": progress,
            "heartbeat_at": heartbeat_at,
            "lease_owner": lease_owner,
            "lease_until": lease_until,
        }
        # Pass only the given fields (a random subset), as a caller would.
        self.both("touch", task_id, **{k: v for k, v in given.items() if v is not None})

    # -- commands --------------------------------------------------------------------------

    @rule(command=commands)
    def submit_command(self, command: Command) -> None:
        if self.both("submit_command", command)[0] == "returned":
            self.submitted.append(command.command_id)

    @rule(lease=lease_seconds, limit=claim_limits)
    def claim_commands(self, lease: float, limit: int) -> None:
        self.both("claim_commands", now=self.now(), lease_seconds=lease, limit=limit)

    @rule(
        command_id=st.sampled_from((*COMMAND_IDS, UNKNOWN_COMMAND)),
        pick=picks,
        outcome_=st.none() | texts,
    )
    def complete_command(self, command_id: str, pick: int, outcome_: str | None) -> None:
        command_id = _pick(pick, self.submitted, command_id)
        self.both("complete_command", command_id, now=self.now(), outcome=outcome_)

    @rule(command_id=st.sampled_from((*COMMAND_IDS, UNKNOWN_COMMAND)), pick=picks)
    def release_command(self, command_id: str, pick: int) -> None:
        command_id = _pick(pick, self.submitted, command_id)
        self.both("release_command", command_id, now=self.now())

    @rule(outcome_=st.none() | texts)
    def finish_a_command_never_submitted(self, outcome_: str | None) -> None:
        """Both stores refuse a command that does not exist (``CommandNotFound``). Its own rule,
        so every run reaches it instead of leaving it to the draw of ids above."""
        self.both("complete_command", UNKNOWN_COMMAND, now=self.now(), outcome=outcome_)
        self.both("release_command", UNKNOWN_COMMAND, now=self.now())

    @rule(micros=st.integers(0, 5_000_000) | st.integers(0, 120_000_000))
    def advance_clock(self, micros: int) -> None:
        self.clock_us += micros

    # -- operations ------------------------------------------------------------------------

    @rule(keep=small_counts)
    def prune(self, keep: int) -> None:
        self.both("prune", keep_terminal=keep)

    @precondition(lambda self: not self.closed and self.steps >= 25)
    @rule()
    def close(self) -> None:
        """Late in a long run: close both; every later rule must see ``StoreClosed`` on
        both sides (the comparison covers it)."""
        self.both("close")
        self.closed = True

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def same_state(self) -> None:
        steps = self.steps  # invariant calls do not count as steps
        if self.closed:
            assert self.both("counts")[:2] == ("raised", "StoreClosed")
        else:
            self.both("counts")
            for task_id in TASK_IDS:
                self.both("get", task_id)
                self.both("history", task_id)
            self.both("query")
        self.steps = steps

    def teardown(self) -> None:
        self.seen = Counter()  # what teardown does every time is not "reached" by the rules
        try:
            if not self.closed:
                # The only way to read commands back: claim every unfinished one.
                self.both("claim_commands", now=FAR_FUTURE, lease_seconds=1, limit=1000)
            self.both("close")
            self.both("close")  # idempotent
            self.closed = True
            for method, args, kwargs in _ONE_CALL_EACH:
                result = self.both(method, *args, **kwargs)
                assert result[:2] == ("raised", "StoreClosed"), (method, result)
        finally:
            self.subject.close()
            self.reference.close()
            _restore_limits()


_SNAP = TaskSnapshot("t1", "job", TaskStatus.PENDING, 1, T0, T0)
_ONE_CALL_EACH: tuple[tuple[str, tuple[Any, ...], dict[str, Any]], ...] = (
    ("create", (_SNAP,), {}),
    ("save", (dataclasses.replace(_SNAP, status_version=2),), {"expect_version": 1}),
    ("get", ("t1",), {}),
    ("query", (), {}),
    ("query", (TaskQuery(limit=0),), {}),
    ("counts", (), {}),
    ("append", (Transition("t1", 1, None, TaskStatus.PENDING, T0),), {}),
    ("history", ("t1",), {}),
    ("touch", ("t1",), {}),
    ("touch", ("t1",), {"heartbeat_at": T0}),
    ("submit_command", (Command("c1", "t1", CommandKind.STOP, T0),), {}),
    ("claim_commands", (), {"now": T0, "lease_seconds": 1.0}),
    ("complete_command", ("c1",), {"now": T0}),
    ("release_command", ("c1",), {"now": T0}),
    ("prune", (), {"keep_terminal": 0}),
)
assert {m for m, _, _ in _ONE_CALL_EACH} | {"close"} == set(PROTOCOL_METHODS)


def _restore_limits() -> None:
    for name, value in DEFAULT_LIMITS.items():
        setattr(redis_module, name, value)


@contextmanager
def _limits_restored() -> Iterator[None]:
    try:
        yield
    finally:
        _restore_limits()


#: Outcomes (label prefixes) the real-server run must reach, or the machine is not exploring
#: what it claims to. (The fakeredis run has too few examples for a reliable floor: it only
#: prints what it reached.)
MUST_SEE = (
    "create: NoneType",
    "create: TaskAlreadyExists",
    "save: NoneType",
    "save: ConcurrencyConflict",
    "save: ValueError",
    "query: empty list",
    "query: list of 1",
    "query: list of 2",
    "query: list of 3+",
    "counts: dict of 3+",
    "append: NoneType",
    "history: empty list",
    "history: list of ",
    "touch: NoneType",
    "submit_command: NoneType",
    "submit_command: CommandAlreadyExists",
    "claim_commands: empty list",
    "claim_commands: list of ",
    "claim_commands: ValueError",
    "complete_command: NoneType",
    "complete_command: CommandNotFound",
    "release_command: NoneType",
    "release_command: CommandNotFound",
    "prune: int 0",
    "prune: int > 0",
    "close: NoneType",
    "counts: StoreClosed",
)


#: The examples of each further round of ``_run`` while the reach floor is not met.
_ROUND = 20


def _run(
    factory: Callable[[], TaskStore], *, max_examples: int, check_reach: bool, cap: int = 0
) -> None:
    """``max_examples`` random sequences; with ``check_reach``, then rounds of ``_ROUND`` more
    while some outcome of ``MUST_SEE`` was never reached, up to ``cap`` examples in all (the
    suite's time goes to the examples: most runs reach the floor well before the cap)."""
    seen: Counter[str] = Counter()
    attrs = {"factory": staticmethod(factory), "seen": seen}
    machine = type("Parity", (StoreParity,), attrs)
    done, examples = 0, max_examples
    while True:
        _run_machine(machine, examples)
        done += examples
        missing = [p for p in MUST_SEE if not any(label.startswith(p) for label in seen)]
        if not check_reach or not missing or done >= max(cap, max_examples):
            break
        examples = min(_ROUND, max(cap, max_examples) - done)
    print(f"outcomes reached in {done} examples:", dict(sorted(seen.items())))
    if check_reach:
        assert not missing, f"the runs never reached {missing}: {dict(seen)}"


def _run_machine(machine: type, max_examples: int) -> None:
    with _limits_restored():
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=max_examples,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[
                    HealthCheck.too_slow,
                    HealthCheck.data_too_large,
                    HealthCheck.filter_too_much,
                ],
            ),
        )


def test_redis_store_matches_the_reference_on_random_operation_sequences(
    redis_proc: RedisProc,
) -> None:
    def factory() -> TaskStore:
        return RedisTaskStore.from_url(redis_proc.url, namespace=f"sm-{uuid.uuid4().hex[:12]}")

    _run(factory, max_examples=40, check_reach=True, cap=100)


def test_redis_store_on_fakeredis_matches_the_reference_on_random_operation_sequences() -> None:
    def factory() -> TaskStore:
        client = fakeredis.FakeRedis(decode_responses=False)
        return RedisTaskStore(client, namespace="sm", check_server=False)

    _run(factory, max_examples=15, check_reach=False)


def test_the_comparison_is_strict() -> None:
    """The normal form tells apart what ``==`` would let through."""
    assert norm(1) != norm(1.0)
    assert norm(True) != norm(1)
    assert norm(b"x") != norm("x")
    assert norm([1]) != norm((1,))
    assert norm(0.0) != norm(-0.0)
    assert norm(T0) != norm(T0.astimezone(TZS[1]))
    assert norm(Progress(1)) != norm(Progress(1.0))
    assert norm(frozenset({"a", "b"})) == norm(frozenset({"b", "a"}))

    def closed() -> None:
        raise StoreClosed()

    assert outcome(closed) == ("raised", "StoreClosed", "the store is closed")
    assert outcome(lambda: [1]) == ("returned", ("list", (("int", 1),)))


# -- minimal reproductions of what the machine found -------------------------------------------


@pytest.mark.parametrize("backend", ["redis-server", "fakeredis"])
def test_create_keeps_the_lease_the_new_snapshot_carries(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """Found by the machine: ``create`` dropped ``lease_owner``/``lease_until`` (the Lua
    argument reader refused lease fields for create as it must for save), while the reference
    writes the whole snapshot (SPEC §2: round trips are exact for every field filled)."""
    if backend == "fakeredis":
        store = RedisTaskStore(fakeredis.FakeRedis(), namespace="lease", check_server=False)
    else:
        server = request.getfixturevalue("redis_proc")
        store = RedisTaskStore.from_url(server.url, namespace=f"lease-{uuid.uuid4().hex[:8]}")
    task = TaskSnapshot(
        "t1", "job", TaskStatus.PENDING, 1, T0, T0, lease_owner="w1", lease_until=T0
    )
    try:
        store.create(task)
        assert store.get("t1") == task
        # save still never writes the lease: a snapshot without one keeps the stored lease
        store.save(dataclasses.replace(task, status_version=2, lease_owner=None), expect_version=1)
        assert store.get("t1") == dataclasses.replace(task, status_version=2)
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["redis-server", "fakeredis"])
def test_query_by_name_applies_the_name_prefix_too(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """Found by the machine: with both ``name`` and ``name_prefix``, the composite index was
    walked for the name alone and (being "exact") no per-task check ran, so a task named
    ``job`` matched ``name_prefix="job."``. The reference requires both."""
    if backend == "fakeredis":
        store = RedisTaskStore(fakeredis.FakeRedis(), namespace="prefix", check_server=False)
    else:
        server = request.getfixturevalue("redis_proc")
        store = RedisTaskStore.from_url(server.url, namespace=f"prefix-{uuid.uuid4().hex[:8]}")
    try:
        store.create(TaskSnapshot("t1", "job", TaskStatus.PENDING, 1, T0, T0))
        assert store.query(TaskQuery(name="job", name_prefix="job.")) == []
        assert store.query(TaskQuery(name="job", name_prefix="x")) == []
        assert [t.task_id for t in store.query(TaskQuery(name="job", name_prefix="jo"))] == ["t1"]
    finally:
        store.close()
