"""The operation log of a stress run: every store call a client makes, with its real-time
bounds and its outcome, for the linearizability check (``stress/lin_history.py``).

``install()`` (in a worker or driver process, when ``CHONGMING_STRESS_OPLOG`` names a directory)
wraps the methods of the store classes the model covers (``RECORDED``) so each call appends to
``<dir>/ops-<pid>.jsonl``:

* ``{"e": "begin", "pid": p, "t": ns}`` once per process (again in a forked child, own file);
* ``{"e": "call", "n": k, "c": "<pid>.<thread>", "t": ns, "m": method, "a": {...}}`` before
  the call: the arguments the models need (task id, expected version, new version, status,
  owner; for the control commands the command id, the caller's ``now``, the lease's end and
  the outcome, as integer microseconds), never the payloads;
* ``{"e": "ok" | "fail" | "unknown", "n": k, "t": ns, "r": ...}`` after it: ``fail`` is a typed
  refusal the store made atomically (a conflict, an existing id, a unique id taken, no such
  command, a bad argument), ``unknown`` anything else (``StoreError``, a connection error, a
  timeout, an interrupt): the write may or may not have happened;
* ``{"e": "end", "t": ns}`` at a clean exit.

Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC is one clock for every process of the machine
(the clock-skew workers fake only the wall clock: ``FAKETIME_DONT_FAKE_MONOTONIC=1``), so bounds
compare across processes. The call's time is taken before its line is written and the call made,
the return's after the call returned.

Recording is buffered, with one exception that makes a SIGKILL harmless: the ``call`` line of a
write is on disk (one ``write(2)`` of the buffer) before the write is sent, so a write can never
have happened without its record. What a kill loses is returns (those operations read as
unknown: the correct reading) and reads (which changed nothing). The rest is flushed every
``FLUSH_SECONDS`` and at exit.

Calls a recorded method makes on its own store (``commit_and_start`` -> ``commit_tasks``, the
``skip-cas`` control's ``blind_start_tasks`` -> ``save``) are not recorded again: the outer call
is the client's operation.

``install`` must run after anything else that replaces those methods (the ``skip-cas`` control
in ``stress/app.py``), so that it wraps what the process really calls.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from chongming_redis.errors import (
    CommandAlreadyExists,
    CommandNotFound,
    ConcurrencyConflict,
    ParentNotFound,
    ScheduleConflict,
    StoreClosed,
    TaskAlreadyExists,
    UniqueTaken,
    WaitingMove,
)
from chongming_redis.model import Command, TaskSnapshot, Transition
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stress import lin_history

OPLOG_ENV = "CHONGMING_STRESS_OPLOG"
FLUSH_SECONDS = 1.0
#: Typed refusals: the store wrote nothing, atomically (an argument refused before any I/O too).
REFUSALS = (UniqueTaken, WaitingMove, ParentNotFound, ScheduleConflict, StoreClosed, ValueError,
            TypeError)  # fmt: skip

Extract = Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any] | None]


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], at: int, name: str) -> Any:
    return args[at] if len(args) > at else kwargs[name]


def _item(item: Sequence[Any]) -> list[Any]:
    snapshot, expect = item[0], item[1]
    return [snapshot.task_id, expect, snapshot.status_version, snapshot.status.value,
            snapshot.lease_owner]  # fmt: skip


def _create(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    s = _arg(a, kw, 0, "snapshot")
    return {"t": s.task_id, "v": s.status_version, "s": s.status.value, "o": s.lease_owner}


def _save(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    s = _arg(a, kw, 0, "snapshot")
    return {"t": s.task_id, "x": kw["expect_version"], "v": s.status_version, "s": s.status.value}


def _write_schedule(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any] | None:
    """A schedule's tick: its task is created in the same atomic step as the state (only
    a write with a ``task`` is an operation of the task model)."""
    task = kw.get("task")
    return None if task is None else _create((task,), {})


def _touch(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any] | None:
    owner = kw.get("lease_owner")
    return None if owner is None else {"t": _arg(a, kw, 0, "task_id"), "o": owner}


def _touch_fenced(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    return {"t": _arg(a, kw, 0, "task_id"), "x": kw["expect_version"], "o": kw.get("lease_owner")}


def _register(snapshot: TaskSnapshot | None) -> list[Any] | None:
    if snapshot is None:
        return None
    return [snapshot.status_version, snapshot.status.value, snapshot.lease_owner]


def _started(snapshots: Iterable[TaskSnapshot]) -> list[list[Any]]:
    return [[s.task_id, s.status_version] for s in snapshots]


def _item_results(results: Sequence[BaseException | None]) -> list[Any]:
    return [None if r is None else refusal(r) for r in results]


def _commit_start_result(result: tuple[Any, Any]) -> dict[str, Any]:
    results, started = result
    # A StoreError in place of the starts: the commit stands and nothing was started.
    return {"c": _item_results(results), "s": [] if isinstance(started, Exception)
            else _started(started)}  # fmt: skip


def _submit_command(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    c = _arg(a, kw, 0, "command")
    return {"k": c.command_id, "l": _us(c.lease_until), "f": _us(c.finished_at), "o": c.outcome}


def _claim_commands(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    """The caller's ``now`` and the lease's end as the stores compute it (``check_claim``:
    ``now + timedelta(seconds=lease_seconds)``, in microseconds)."""
    now = kw["now"]
    return {"w": encode_dt(now), "u": encode_dt(now + timedelta(seconds=kw["lease_seconds"]))}


def _complete_command(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    return {"k": _arg(a, kw, 0, "command_id"), "w": encode_dt(kw["now"]), "o": kw.get("outcome")}


def _command_state(command: Command | None) -> list[Any] | None:
    if command is None:
        return None
    return [_us(command.lease_until), _us(command.finished_at), command.outcome]


def _us(moment: datetime | None) -> int | None:
    return None if moment is None else encode_dt(moment)


def _command_id(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    return {"k": _arg(a, kw, 0, "command_id")}


#: method -> (arguments to record, result to record, whether it writes). The arguments'
#: positions are the protocol's (everything after the first is keyword-only).
RECORDED: dict[str, tuple[Extract, Callable[[Any], Any], bool]] = {
    "create": (_create, lambda r: None, True),
    "write_schedule": (_write_schedule, lambda r: bool(r[1]), True),
    "save": (_save, lambda r: None, True),
    "get": (lambda a, kw: {"t": _arg(a, kw, 0, "task_id")}, _register, False),
    "commit_tasks": (
        lambda a, kw: {"i": [_item(i) for i in _arg(a, kw, 0, "items")]}, _item_results, True),
    "start_tasks": (lambda a, kw: {"o": kw["owner"]}, _started, True),
    "commit_and_start": (
        lambda a, kw: {"i": [_item(i) for i in _arg(a, kw, 0, "items")], "o": kw["owner"]},
        _commit_start_result, True),
    "touch": (_touch, lambda r: None, True),
    "touch_fenced": (_touch_fenced, bool, True),
    "expire_finished": (lambda a, kw: {}, list, True),
    "prune": (lambda a, kw: {}, int, True),
    "submit_command": (_submit_command, lambda r: None, True),
    "claim_commands": (_claim_commands,
                       lambda r: [[c.command_id, _us(c.lease_until)] for c in r], True),
    "complete_command": (_complete_command, lambda r: None, True),
    "release_command": (_command_id, lambda r: None, True),
    "get_command": (_command_id, _command_state, False),
}  # fmt: skip


def refusal(exc: BaseException) -> list[Any] | None:
    """The recorded form of a typed refusal, or ``None`` if ``exc`` leaves the outcome
    unknown."""
    if isinstance(exc, ConcurrencyConflict):
        return ["conflict", exc.actual]
    if isinstance(exc, (TaskAlreadyExists, CommandAlreadyExists)):
        return ["exists"]
    if isinstance(exc, CommandNotFound):
        return ["notfound"]
    if isinstance(exc, REFUSALS):
        return ["refused", type(exc).__name__]
    return None


class Recorder:
    """One process's log file: thread-safe, buffered, reopened in a forked child, and moved to
    another directory by ``reopen`` (the harness's driver, one directory per run)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.local = threading.local()
        self._open()
        os.register_at_fork(after_in_child=self._reopen_in_child)
        atexit.register(self.close)

    def _open(self) -> None:
        self._lock = threading.Lock()
        self._buffer: list[str] = []
        self._count = 0
        self._clients: dict[int, str] = {}  # thread -> "<pid>.<n>": short names in examples
        self._closed = False
        self.pid = os.getpid()
        self.path = self.directory / f"ops-{self.pid}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._last_flush = time.monotonic()
        self._generation = getattr(self, "_generation", 0) + 1  # the flusher of this file
        self._line({"e": "begin", "pid": self.pid, "t": time.monotonic_ns()}, flush=True)
        threading.Thread(target=self._flusher, args=(self._generation,), name="oplog-flush",
                         daemon=True).start()  # fmt: skip

    def reopen(self, directory: str | os.PathLike[str]) -> None:
        """Close this file (clean exit line included) and record into ``directory`` from now
        on."""
        self.close()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._open()

    def _reopen_in_child(self) -> None:
        if not self._closed:  # the parent's buffer is the parent's: the child starts its own
            self._open()

    def invoke(self, method: str, args: dict[str, Any], writes: bool) -> int:
        at = time.monotonic_ns()
        with self._lock:
            client = self._clients.setdefault(threading.get_ident(),
                                              f"{self.pid}.{len(self._clients) + 1}")  # fmt: skip
            self._count += 1
            number = self._count
            self._line({"e": "call", "n": number, "c": client, "t": at, "m": method, "a": args},
                       flush=writes)  # fmt: skip
        return number

    def finish(self, number: int, kind: str, result: Any) -> None:
        at = time.monotonic_ns()
        with self._lock:
            self._line({"e": kind, "n": number, "t": at, "r": result}, flush=False)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            if self._closed or self.pid != os.getpid():
                return
            self._line({"e": "end", "t": time.monotonic_ns()}, flush=True)
            os.close(self._fd)
            self._closed = True

    def _line(self, record: Mapping[str, Any], *, flush: bool) -> None:
        if self._closed:
            return
        self._buffer.append(json.dumps(record, separators=(",", ":")) + "\n")
        if flush or time.monotonic() - self._last_flush > FLUSH_SECONDS:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            os.write(self._fd, "".join(self._buffer).encode())
            self._buffer.clear()
        self._last_flush = time.monotonic()

    def _flusher(self, generation: int) -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            with self._lock:
                if self._closed or self.pid != os.getpid() or generation != self._generation:
                    return
                self._flush()


def record_class(cls: type, recorder: Recorder) -> type:
    """Wrap ``cls``'s methods named in ``RECORDED`` (those it has) to record every call into
    ``recorder``; a method already wrapped for ``recorder`` is left alone. Returns ``cls``."""
    for name, spec in RECORDED.items():
        original = getattr(cls, name, None)
        if original is None or getattr(original, "__oplog__", None) is recorder:
            continue
        setattr(cls, name, _recorded(recorder, name, original, spec))
    return cls


def _recorded(
    recorder: Recorder,
    name: str,
    original: Callable[..., Any],
    spec: tuple[Extract, Callable[[Any], Any], bool],
) -> Callable[..., Any]:
    extract, outcome, writes = spec

    @functools.wraps(original)
    def recorded(self: object, *args: Any, **kwargs: Any) -> Any:
        if getattr(recorder.local, "inside", False):  # a call the recorded one makes itself
            return original(self, *args, **kwargs)
        try:
            recorded_args = extract(args, kwargs)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError, OverflowError):
            recorded_args = None  # malformed arguments: the store refuses them before any I/O
        if recorded_args is None:
            return original(self, *args, **kwargs)
        number = recorder.invoke(name, recorded_args, writes)
        recorder.local.inside = True
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            refused = refusal(exc)
            kind = "unknown" if refused is None else "fail"
            recorder.finish(number, kind, refused or type(exc).__name__)
            raise
        finally:
            recorder.local.inside = False
        recorder.finish(number, "ok", outcome(result))
        return result

    # Which recorder: a class wrapped for another one (the driver's, in a test process that
    # ran the harness) is wrapped again, each recorder keeping what it was given.
    recorded.__oplog__ = recorder  # type: ignore[attr-defined]
    return recorded


_installed: Recorder | None = None


def install(directory: str | os.PathLike[str] | None = None,
            classes: Sequence[type] | None = None) -> Recorder | None:  # fmt: skip
    """Record this process's store calls into ``directory`` (by default
    ``$CHONGMING_STRESS_OPLOG``; neither: nothing is recorded, ``None``). ``classes``: the store
    classes to wrap (by default the built-in stores: Redis, SQLite, PostgreSQL). Idempotent
    within a process; a call with another directory (or after ``close``) moves the recording
    there (the harness's driver: one directory per run)."""
    global _installed
    where = directory if directory is not None else os.environ.get(OPLOG_ENV)
    if not where:
        return None
    if _installed is None:
        _installed = Recorder(where)
    elif _installed.closed or Path(where) != _installed.directory:
        _installed.reopen(where)
    if classes is None:
        classes = _builtin_stores()
    for cls in classes:
        record_class(cls, _installed)
    return _installed


def _builtin_stores() -> tuple[type, ...]:
    """Redis, SQLite and, where its extra is installed, PostgreSQL (a wheel without
    ``[postgres]`` runs the stress harness on Redis and SQLite: nothing to record there)."""
    from chongming_redis.errors import MissingExtra
    from chongming_redis.stores.redis import RedisTaskStore
    from chongming_redis.stores.sqlite import SqliteTaskStore

    try:
        from chongming_redis.stores.postgres import PostgresTaskStore
    except MissingExtra:
        return (RedisTaskStore, SqliteTaskStore)
    return (RedisTaskStore, SqliteTaskStore, PostgresTaskStore)


def check_dir(
    path: str | os.PathLike[str],
    final_histories: Mapping[str, Sequence[Transition]] | None = None,
    *,
    final_snapshots: Mapping[str, TaskSnapshot | None] | None = None,
    read_command: Callable[[str], Command | None] | None = None,
    read_history: Callable[[str], Sequence[Transition]] | None = None,
    read_task: Callable[[str], TaskSnapshot | None] | None = None,
    budget: int = lin_history.DEFAULT_BUDGET,
) -> dict[str, Any]:
    """The report's ``linearizability`` section for the logs in ``path`` (every
    ``ops-*.jsonl``): ``{"histories", "operations", "violations", "unknown", ...}``; see
    ``lin_history.check_records``. ``final_histories`` (``store.history(task_id)`` after the
    run) attributes start and release entries no recorded ``ok`` explains; ``final_snapshots``
    adds a last read of each task after every operation, ``read_command`` (the store's
    ``get_command``) one of each recorded command; ``read_history`` and ``read_task`` (the
    store's ``history`` and ``get``) both of each recorded task the mappings leave out. The
    control commands are checked per command (``stress/lin_commands.py``):
    ``report["commands"]`` counts their histories and operations, and their violations and
    unknowns name a ``command_id`` where the tasks' name a ``task_id``."""
    files = sorted(Path(path).glob("ops-*.jsonl"))
    return lin_history.check_records(
        lin_history.read_logs(files), final_histories, final_snapshots,
        read_command=read_command, read_history=read_history, read_task=read_task,
        budget=budget,
    )  # fmt: skip
