"""``JsonFileTaskStore``: a third-party ``TaskStore`` that keeps everything in one JSON file.

This is the runnable example of ``docs/store-guide.md`` §7: a backend written the way an outside
author would write one. It inherits from nothing (``TaskStore`` is a structural protocol),
reuses ``chongming_redis.stores.codec`` for every record and
``chongming_redis.stores._checks`` for every argument check, so it refuses what the built-in
stores refuse, with the same exceptions and messages. ``tests/test_json_file_store.py`` binds it
to the whole ``StoreContract``.

**Single process only.** It is correct for one process (one lock serialises its threads), and
NOT safe when two processes share the file: every operation is "read the file, change it, write
it back" with no lock between the read and the write, so when two processes read the same
contents both write back and the later ``os.replace`` silently discards the other's change —
even a ``save`` whose version check both of them passed. ``test_the_naive_file_store_is_not_
cross_process_safe`` demonstrates that lost update with two real processes. To share state
between processes use ``RedisTaskStore``, where every operation is one atomic Lua script.

Two lessons are built in, and both matter even in one process:

1. **No cache.** The file is re-read on every operation. Two instances that each kept a copy in
   memory would never see each other's writes.
2. **Atomic write-back.** The new contents go to a temporary file whose name carries the pid,
   then ``os.replace`` swaps it in, so a reader never sees an empty or half-written file (a
   plain ``write_text`` truncates first). There is no ``fsync``: a machine crash can lose the
   last writes; a durable variant would fsync the temporary file before the replace and the
   directory after it.

A file has no indexes, so ``query`` and ``counts`` read every task; in a real backend the
filters are pushed down to the storage.

File layout::

    {"format": 1,
     "tasks":    {task_id: row},
     "history":  {task_id: {"<version>": row}},
     "commands": {command_id: row}}

where a row is a codec row; its ``bytes`` columns (msgpack ``params``/``result``/``payload``)
are wrapped as ``{"base64": "..."}`` because JSON has no bytes.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from chongming_redis.errors import (
    CommandAlreadyExists,
    CommandNotFound,
    ConcurrencyConflict,
    CorruptRecord,
    StoreClosed,
    TaskAlreadyExists,
)
from chongming_redis.model import (
    Command,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores.codec import (
    LEASE_COLUMNS,
    Row,
    RowError,
    command_to_row,
    row_to_command,
    row_to_snapshot,
    row_to_transition,
    snapshot_to_row,
    touch_columns,
    transition_to_row,
)
from chongming_redis.validation import check_identifier, check_int

FORMAT = 1
JsonRow = dict[str, Any]


@dataclass
class _State:
    """The whole file, as JSON rows. ``changed`` says whether it must be written back."""

    tasks: dict[str, JsonRow] = field(default_factory=dict)
    history: dict[str, dict[str, JsonRow]] = field(default_factory=dict)
    commands: dict[str, JsonRow] = field(default_factory=dict)
    changed: bool = False


class JsonFileTaskStore:
    """A ``TaskStore`` in one JSON file at ``path`` (created on the first write)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"JsonFileTaskStore({str(self._path)!r})"

    # -- task snapshots --------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        row = snapshot_to_row(check.check_snapshot(snapshot))
        with self._transaction() as state:
            if snapshot.task_id in state.tasks:
                raise TaskAlreadyExists(snapshot.task_id)
            state.tasks[snapshot.task_id] = _to_json(row)
            state.changed = True

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        row = snapshot_to_row(check.check_save(snapshot, expect_version))
        with self._transaction() as state:
            # The race of this whole example lives here: between reading the file (in
            # _transaction) and os.replace below, another process can do the same.
            raw = state.tasks.get(snapshot.task_id)
            current = None if raw is None else self._snapshot(snapshot.task_id, raw)
            actual = None if current is None else current.status_version
            if actual != expect_version:
                raise ConcurrencyConflict(snapshot.task_id, expect_version, actual)
            assert raw is not None
            new = _to_json(row)
            for column in LEASE_COLUMNS:  # save never writes the lease: keep what touch wrote
                new[column] = raw.get(column)
            state.tasks[snapshot.task_id] = new
            state.changed = True

    def get(self, task_id: str) -> TaskSnapshot | None:
        check_identifier(task_id, "task_id")
        with self._transaction() as state:
            raw = state.tasks.get(task_id)
            return None if raw is None else self._snapshot(task_id, raw)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        with self._transaction() as state:
            found = [
                task
                for task in (self._snapshot(tid, raw) for tid, raw in state.tasks.items())
                if _matches(task, q)
            ]
        found.sort(key=lambda t: (t.created_at, t.task_id), reverse=q.newest_first)
        return found if q.limit is None else found[: q.limit]

    def counts(self) -> dict[TaskStatus, int]:
        with self._transaction() as state:
            result = dict.fromkeys(TaskStatus, 0)
            for task_id, raw in state.tasks.items():
                result[self._snapshot(task_id, raw).status] += 1
            return result

    # -- audit history ---------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        row = transition_to_row(check.check_transition(transition))
        with self._transaction() as state:
            entries = state.history.setdefault(transition.task_id, {})
            if str(transition.version) not in entries:  # first write wins: idempotent
                entries[str(transition.version)] = _to_json(row)
                state.changed = True

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        check_identifier(task_id, "task_id")
        check_int(since_version, "since_version")
        with self._transaction() as state:
            entries = state.history.get(task_id, {})
            found = [self._transition(task_id, raw) for raw in entries.values()]
        return sorted((t for t in found if t.version > since_version), key=lambda t: t.version)

    # -- high-frequency side path ----------------------------------------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        check.check_touch(task_id, progress, heartbeat_at, lease_owner, lease_until)
        changes = touch_columns(progress, heartbeat_at, lease_owner, lease_until)
        with self._transaction() as state:
            raw = state.tasks.get(task_id)
            if raw is not None and changes:  # a late heartbeat for a vanished task is fine
                raw.update(_to_json(changes))  # never status_version: touch is not a save
                state.changed = True

    # -- control commands ------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        row = command_to_row(check.check_command(command))
        with self._transaction() as state:
            if command.command_id in state.commands:
                raise CommandAlreadyExists(command.command_id)
            state.commands[command.command_id] = _to_json(row)
            state.changed = True

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        until = check.check_claim(now, lease_seconds, limit)
        with self._transaction() as state:
            ready = [
                cmd
                for cmd in (self._command(cid, raw) for cid, raw in state.commands.items())
                if cmd.finished_at is None and (cmd.lease_until is None or cmd.lease_until <= now)
            ]
            ready.sort(key=lambda c: (c.created_at, c.command_id))
            claimed = [replace(cmd, lease_until=until) for cmd in ready[:limit]]
            for cmd in claimed:
                state.commands[cmd.command_id] = _to_json(command_to_row(cmd))
            state.changed = bool(claimed)
            return claimed

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        check.check_complete(command_id, now, outcome)
        with self._transaction() as state:
            cmd = self._existing_command(state, command_id)
            if cmd.finished_at is None:  # completing twice keeps the first outcome
                done = replace(cmd, finished_at=now, outcome=outcome)
                state.commands[command_id] = _to_json(command_to_row(done))
                state.changed = True

    def release_command(self, command_id: str, *, now: datetime) -> None:
        check.check_release(command_id, now)
        with self._transaction() as state:
            cmd = self._existing_command(state, command_id)
            if cmd.finished_at is None and cmd.lease_until is not None:
                # Clear the lease, never finish: the true holder must be able to claim it.
                state.commands[command_id] = _to_json(
                    command_to_row(replace(cmd, lease_until=None))
                )
                state.changed = True

    # -- operations ------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        keep = check.check_keep_terminal(keep_terminal)
        with self._transaction() as state:
            terminal = [
                task
                for task in (self._snapshot(tid, raw) for tid, raw in state.tasks.items())
                if task.status.is_terminal
            ]
            terminal.sort(key=lambda t: (t.created_at, t.task_id))
            doomed = terminal[: max(0, len(terminal) - keep)]
            for task in doomed:
                del state.tasks[task.task_id]
                state.history.pop(task.task_id, None)
            state.changed = bool(doomed)
            return len(doomed)

    def close(self) -> None:
        # No handle stays open between operations; closing only refuses further calls.
        with self._lock:
            self._closed = True

    # -- the file --------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[_State]:
        """Lock, refuse if closed, re-read the file, run the body, write back if it changed.

        The lock is a ``threading.Lock``: it orders this process's threads and nothing else.
        """
        with self._lock:
            if self._closed:
                raise StoreClosed()
            state = self._read()
            yield state
            if state.changed:
                self._write(state)

    def _read(self) -> _State:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return _State()
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CorruptRecord(str(self._path), None, f"not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CorruptRecord(str(self._path), None, f"not a format-{FORMAT} store file")
        tasks, history, commands = (data.get(n) for n in ("tasks", "history", "commands"))
        if not (isinstance(tasks, dict) and isinstance(history, dict)):
            raise CorruptRecord(str(self._path), None, "missing tasks/history/commands")
        if not isinstance(commands, dict):
            raise CorruptRecord(str(self._path), None, "missing tasks/history/commands")
        return _State(tasks, history, commands)

    def _write(self, state: _State) -> None:
        data = {
            "format": FORMAT,
            "tasks": state.tasks,
            "history": state.history,
            "commands": state.commands,
        }
        # The pid keeps two processes from writing into the same temporary file; it does not
        # make read-modify-write safe between processes (see the module docstring).
        temporary = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(temporary, self._path)

    # -- decoding, with errors that name the record ----------------------------------------

    def _snapshot(self, task_id: str, raw: object) -> TaskSnapshot:
        key = f"{self._path}#tasks/{task_id}"
        return _decode(key, raw, row_to_snapshot)  # type: ignore[no-any-return]

    def _transition(self, task_id: str, raw: object) -> Transition:
        key = f"{self._path}#history/{task_id}"
        return _decode(key, raw, row_to_transition)  # type: ignore[no-any-return]

    def _command(self, command_id: str, raw: object) -> Command:
        key = f"{self._path}#commands/{command_id}"
        return _decode(key, raw, row_to_command)  # type: ignore[no-any-return]

    def _existing_command(self, state: _State, command_id: str) -> Command:
        raw = state.commands.get(command_id)
        if raw is None:
            raise CommandNotFound(command_id)
        return self._command(command_id, raw)


def _to_json(row: Mapping[str, Any]) -> JsonRow:
    """A codec row as JSON values: ``bytes`` become ``{"base64": ...}``."""
    return {
        column: {"base64": base64.b64encode(value).decode("ascii")}
        if isinstance(value, bytes)
        else value
        for column, value in row.items()
    }


def _from_json(key: str, raw: object) -> Row:
    if not isinstance(raw, dict):
        raise CorruptRecord(key, None, f"a row must be a JSON object, not {type(raw).__name__}")
    row: Row = {}
    for column, value in raw.items():
        if isinstance(value, dict):
            try:
                value = base64.b64decode(value["base64"], validate=True)
            except (KeyError, TypeError, ValueError):
                raise CorruptRecord(key, column, "not a {'base64': ...} object") from None
        elif isinstance(value, list | bool):
            raise CorruptRecord(key, column, f"unexpected JSON {type(value).__name__}")
        row[column] = value
    return row


def _decode(key: str, raw: object, decode: Any) -> Any:
    try:
        return decode(_from_json(key, raw))
    except RowError as exc:
        raise CorruptRecord(key, exc.column, exc.detail) from None


def _matches(task: TaskSnapshot, q: TaskQuery) -> bool:
    return (
        (q.statuses is None or task.status in q.statuses)
        and (q.name is None or task.name == q.name)
        and (q.name_prefix is None or task.name.startswith(q.name_prefix))
        and (q.tag is None or q.tag in task.tags)
        and (q.buckets is None or task.bucket in q.buckets)
        and (q.pipeline_run_id is None or task.pipeline_run_id == q.pipeline_run_id)
    )
