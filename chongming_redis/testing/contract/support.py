"""What every section of the contract shares: fixed instants, record builders, awkward ids,
``raises``, and ``ContractBase`` (the store fixture and small helpers).

Times are fixed instants, never the wall clock, so the suite is deterministic.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from chongming_redis import (
    Command,
    CommandKind,
    Failure,
    Progress,
    StoreClosed,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores.protocol import TaskStore

E = TypeVar("E", bound=BaseException)

T0 = datetime(2024, 3, 10, 12, 0, 0, 123456, tzinfo=timezone.utc)
ONE_US = timedelta(microseconds=1)
PENDING, RUNNING, PAUSED = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED
SUCCEEDED, FAILED, STOPPED, LOST = (
    TaskStatus.SUCCEEDED,
    TaskStatus.FAILED,
    TaskStatus.STOPPED,
    TaskStatus.LOST,
)
LIVE = (PENDING, RUNNING, PAUSED)
TERMINAL = (SUCCEEDED, FAILED, STOPPED, LOST)
#: The statuses of the 14-method contract: ``WAITING`` belongs to the dependencies extension
#: (``DependenciesStore``; its contract is ``testing/extensions/dependencies.py``), and a store
#: written before it may leave it out of ``counts()``.
CORE_STATUSES = (*LIVE, *TERMINAL)
MAX_CLAIM_LIMIT = 1000  # the shared argument checks (stores/_checks.py) cap a claim batch
MAX_LEASE_SECONDS = 7 * 24 * 3600.0  # the longest command lease (protocol: claim_commands)
LATEST = datetime(2255, 6, 5, 23, 47, 34, 740991, tzinfo=timezone.utc)  # the last storable µs
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
NAIVE = datetime(2024, 3, 10, 12, 0)  # no timezone: never a storable instant
MAX = 2**53 - 1  # the largest integer a store must hold exactly

# Ids that are valid (non-empty, <= 1,024 UTF-8 bytes, encodable) but awkward for a backend that
# builds keys, glob patterns, LIKE clauses or escapes from them. Each must be its own task.
AWKWARD_IDS: tuple[str, ...] = (
    ":",
    "a:b",
    "x",
    "x:history",
    "x:commands",
    "{x}",
    "x}y",
    "*",
    "?",
    "a[b]",
    "%",
    "a_b",
    " ",
    "  ",
    " lead",
    "trail ",
    "\n",
    "\r\n",
    "\t",
    "\x00",
    "..",
    "/",
    "\\",
    "'; DROP TABLE tasks; --",
    '"quoted"',
    "\u00e9",  # é, NFC
    "e\u0301",  # é, NFD: a different id
    "任务",
    "🙂",
    "é" * 512,  # exactly 1,024 UTF-8 bytes
)


def raises(exc_type: type[E], fn: Callable[..., object], /, *args: Any, **kwargs: Any) -> E:
    """Call ``fn(*args, **kwargs)`` and return the ``exc_type`` it raised; fail otherwise."""
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        return exc
    except Exception as exc:
        raise AssertionError(
            f"expected {exc_type.__name__}, got {type(exc).__name__}: {exc}"
        ) from exc
    raise AssertionError(f"expected {exc_type.__name__}, but nothing was raised")


def at(seconds: float = 0.0) -> datetime:
    """The fixed instant ``seconds`` after ``T0`` (UTC)."""
    return T0 + timedelta(seconds=seconds)


def snapshot(
    task_id: str = "t1",
    *,
    name: str = "job",
    status: TaskStatus = PENDING,
    version: int = 1,
    created: float = 0.0,
    **fields: Any,
) -> TaskSnapshot:
    """A task created ``created`` seconds after ``T0``; ``fields`` fill anything else."""
    fields.setdefault("created_at", at(created))
    fields.setdefault("updated_at", at(created))
    return TaskSnapshot(task_id=task_id, name=name, status=status, status_version=version, **fields)


def transition(
    task_id: str,
    version: int,
    *,
    to: TaskStatus = RUNNING,
    reason: str | None = None,
) -> Transition:
    """The history entry that produced ``version`` (version 1 records the creation)."""
    return Transition(
        task_id=task_id,
        version=version,
        from_status=None if version == 1 else PENDING,
        to_status=to,
        at=at(version),
        reason=reason,
    )


def command(
    command_id: str = "c1",
    *,
    created: float = 0.0,
    task_id: str = "t1",
    kind: CommandKind = CommandKind.STOP,
    **fields: Any,
) -> Command:
    return Command(
        command_id=command_id, task_id=task_id, kind=kind, created_at=at(created), **fields
    )


def full_snapshot() -> TaskSnapshot:
    """A task with every field filled, in the shapes that get lost silently: a non-UTC
    timezone, microseconds, non-ASCII frozenset tags, nested payloads with bytes and a large
    int, a float progress and a failure with a traceback. The lease is left to ``touch``."""
    tz = timezone(timedelta(hours=-3, minutes=-30))
    created = datetime(2024, 3, 10, 8, 30, 0, 654321, tzinfo=tz)
    return TaskSnapshot(
        task_id="full-任务-1",
        name="etl.load-ü",
        status=RUNNING,
        status_version=7,
        created_at=created,
        updated_at=created + timedelta(seconds=5, microseconds=1),
        tags=frozenset({"io", "紧急", "with space", "a:b"}),
        bucket=2**31 - 1,
        key="customer:42/ü",
        pipeline_run_id="run-Ω-3",
        params={
            "nested": {"list": [1, 2.5, "três", None, True, False, b"\x00\xff"], "empty": {}},
            "big": 2**62 + 1,  # not exact in a double
            "negative": -(2**62) - 1,
            "bytes": b"\x00\x01\x02",
            "text": "ünï©ødé ✓",
            "items": [[1, [2, [3]]], {"k": []}],
        },
        result=[{"ok": True, "rows": 10**12}, 3.25, "done"],
        progress=Progress(2.5, 10.0, "halfway ✓"),
        failure=Failure(
            "ValueError",
            "bad ünicode",
            'Traceback (most recent call last):\n  File "job.py", line 1\nValueError: ✗\n',
        ),
        heartbeat_at=datetime(2024, 3, 10, 15, 0, 0, 1, tzinfo=timezone(timedelta(hours=2))),
        attempt=3,
        not_before=datetime(2024, 3, 11, 0, 0, 0, 999999, tzinfo=timezone(timedelta(hours=9))),
        priority=-42,
    )


def counted(**by_status: int) -> dict[TaskStatus, int]:
    """Every status at zero except the ones named (``counted(pending=2)``)."""
    result = dict.fromkeys(TaskStatus, 0)
    for value, number in by_status.items():
        result[TaskStatus(value)] = number
    return result


class ContractBase:
    """The store under test and the helpers every section uses."""

    store: TaskStore
    _store_closed: bool = False

    def make_store(self) -> TaskStore:
        """Return a fresh, isolated, empty store. Every binding must define this."""
        raise NotImplementedError("bind StoreContract: define make_store() in the subclass")

    def setup_method(self, method: object) -> None:
        self._store_closed = False
        self.store = self.make_store()

    def teardown_method(self, method: object) -> None:
        if not self._store_closed and hasattr(self, "store"):
            self.store.close()

    # -- helpers -----------------------------------------------------------------------------

    def close_store(self) -> None:
        self._store_closed = True
        self.store.close()

    def counts(self) -> dict[TaskStatus, int]:
        """``store.counts()``, with ``WAITING`` at 0 where a store written before the
        dependencies extension leaves it out."""
        return {TaskStatus.WAITING: 0, **self.store.counts()}

    def put(self, *snapshots: TaskSnapshot) -> None:
        for item in snapshots:
            self.store.create(item)

    def ids(self, query: TaskQuery | None = None) -> list[str]:
        return [s.task_id for s in self.store.query(query)]

    def where(self, **filters: Any) -> list[str]:
        return self.ids(TaskQuery(**filters))

    def claimed(self, seconds: float, *, lease: float = 30.0, limit: int = 50) -> list[str]:
        found = self.store.claim_commands(now=at(seconds), lease_seconds=lease, limit=limit)
        return [c.command_id for c in found]

    def assert_untouched(self, before: TaskSnapshot) -> None:
        assert self.store.get(before.task_id) == before


def outcome_of(call: Callable[[], object]) -> str:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__ if isinstance(exc, StoreClosed) else f"{exc!r}"
    return "returned normally"


def parameters_of(fn: Callable[..., object], *, drop_self: bool) -> list[tuple[str, str, object]]:
    """Name, kind and default of each parameter (annotations are not compared)."""
    params: Iterable[inspect.Parameter] = inspect.signature(fn).parameters.values()
    listed = [(p.name, p.kind.name, p.default) for p in params]
    return listed[1:] if drop_self else listed
