"""``RedisTaskStore``: the ``TaskStore`` protocol on Redis, one Lua script per operation.

Every write is one ``EVALSHA`` of a script from ``lua/`` that validates everything, then writes
the task, its indexes and counters together, so they can never disagree. Reads are plain
``HGETALL``/``ZRANGEBYSCORE`` calls, or the read-only ``query`` script (``EVALSHA_RO``). The
layout is documented in ``docs/redis-layout.md`` and built in ``_keys.py`` alone.

Retries: redis-py re-sends a command whose connection failed, even if the server ran it (the
reply was lost, not the command). Each write therefore carries a token the script recognises:
a retried ``create``/``save``/``submit_command`` whose first attempt landed reports success, a
retried ``claim_commands`` returns the batch the first attempt leased, and ``append``, ``touch``,
``complete_command`` and ``release_command`` are idempotent by nature.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.commands.core import Script
from redis.retry import Retry

from chongming_redis.errors import CorruptRecord, StoreClosed, StoreError, StoreUnavailable
from chongming_redis.model import (
    Command,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores import _common as check
from chongming_redis.stores import _replies as replies
from chongming_redis.stores._keys import (
    COMMAND_COLUMNS_BY_FIELD,
    COMMAND_FIELDS,
    TASK_COLUMNS_BY_FIELD,
    TASK_FIELDS,
    Keys,
)
from chongming_redis.stores._redis_extensions import RedisExtensions
from chongming_redis.stores._redis_rows import (
    choose_source,
    decode_entry,
    encode_entry,
    fast_snapshot,
    field_of,
    hash_changes,
    pairs,
    task_hash_changes,
    token,
    write_token,
)
from chongming_redis.stores._redis_server import check_server_settings, supports_script_flags
from chongming_redis.stores._replies import text as _text
from chongming_redis.stores._scripts import READ_ONLY_SCRIPTS, SCRIPT_NAMES, script_text
from chongming_redis.stores.codec import (
    LEASE_COLUMNS,
    Primitive,
    Row,
    RowError,
    command_to_row,
    encode_dt,
    row_to_command,
    row_to_snapshot,
    snapshot_to_row,
    touch_columns,
)
from chongming_redis.validation import check_identifier, check_int

log = logging.getLogger("chongming_redis.store")

T = TypeVar("T")

#: Matches returned per ``query`` script call, and entries examined when filters remain.
QUERY_PAGE = 500
QUERY_BUDGET = 1000
#: Tasks ``prune`` drops per script call (each call stays well under a millisecond per task).
PRUNE_BATCH = 100


_STATUS_FIELDS = [status.value for status in TaskStatus]


class RedisTaskStore(RedisExtensions):
    """A ``TaskStore`` on one Redis database, isolated by ``namespace``.

    ``client`` must be a ``redis.Redis`` created with ``decode_responses=False`` (values are
    binary). Use ``from_url`` to get one with bounded timeouts and retries.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str,
        check_server: bool = True,
        owns_client: bool = False,
        audit: bool = False,
        audit_owner: str | None = None,
    ) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisTaskStore needs a client with decode_responses=False")
        self.keys = Keys(namespace)
        self._client = client
        self._owns_client = owns_client
        self._closed = False
        #: When on, every command lease change (claim, complete, release) is also appended,
        #: by the same script, to the stream ``{ns}:audit`` (see ``Keys``): the server-side
        #: record the stress checker ``check_command_leases`` reads.
        self.audit = bool(audit)
        self._audit_flag = "1" if audit else "0"
        #: The name written as ``owner`` into this store's audit entries: who claimed,
        #: completed or released. Default ``<nodename>-<pid>``, the owner name a
        #: ``chongming-redis worker`` process gives its controller; settable.
        self.audit_owner = audit_owner or f"{os.uname().nodename}-{os.getpid()}"
        self.legacy_scripts = False
        with self._errors():
            self.legacy_scripts = not supports_script_flags(client)
            self._scripts: dict[str, Script] = {
                name: client.register_script(script_text(name, legacy=self.legacy_scripts))
                for name in SCRIPT_NAMES
            }
            if check_server:
                check_server_settings(client)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str,
        socket_timeout: float = 5.0,
        socket_connect_timeout: float = 2.0,
        retries: int = 3,
        check_server: bool = True,
        audit: bool = False,
        audit_owner: str | None = None,
        **options: Any,
    ) -> RedisTaskStore:
        """Connect to ``url`` (``redis://``, ``rediss://`` or ``unix://``).

        A call fails with ``StoreUnavailable`` after at most about
        ``(retries + 1) * (socket_timeout + socket_connect_timeout)`` seconds, never hangs.
        """
        Keys(namespace)  # refuse a bad namespace before connecting
        try:
            client = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_connect_timeout,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries),
                decode_responses=False,
                **options,
            )
        except ValueError as exc:
            raise ValueError(f"bad Redis URL {url!r}: {exc}") from None
        return cls(
            client,
            namespace=namespace,
            check_server=check_server,
            owns_client=True,
            audit=audit,
            audit_owner=audit_owner,
        )

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    # -- task snapshots --------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        row = snapshot_to_row(check.check_snapshot(snapshot))
        key = self.keys.task(snapshot.task_id)
        args = self._task_args(row, "", with_lease=True)
        self._run("create", [key, self.keys.root], args, task_id=snapshot.task_id)

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        row = snapshot_to_row(check.check_save(snapshot, expect_version))
        keys = [self.keys.task(snapshot.task_id), self.keys.root]
        args = self._task_args(row, expect_version)
        self._run("save", keys, args, task_id=snapshot.task_id, expected=expect_version)

    def get(self, task_id: str) -> TaskSnapshot | None:
        check_identifier(task_id, "task_id")
        key = self.keys.task(task_id)
        fields: dict[bytes, bytes] = self._read(key, lambda c: c.hgetall(key))  # type: ignore[arg-type,return-value]
        return None if not fields else self._decode_task(task_id, fields)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        if q.limit == 0 or q.statuses == frozenset() or q.buckets == frozenset():
            self._check_open()
            return []
        source_kind, source_arg = choose_source(q)
        filters = [
            " ".join(sorted(s.value for s in q.statuses or ())),
            " ".join(str(b) for b in sorted(q.buckets or ())),
            q.name or "",
            q.name_prefix or "",
            q.tag or "",
            q.pipeline_run_id or "",
        ]
        # The composite index already applies every filter but tag and pipeline.
        exact_source = source_kind == "ix"
        results: list[TaskSnapshot] = []
        cursor: tuple[str, str] = ("", "")
        remaining = math.inf if q.limit is None else q.limit
        while remaining > 0:
            want = int(min(remaining, QUERY_PAGE))
            budget = want if exact_source else max(want, QUERY_BUDGET)
            args = ["desc" if q.newest_first else "asc", want, budget, *cursor]
            exact = "1" if exact_source else "0"
            reply = self._run(
                "query", [self.keys.root], [*args, source_kind, source_arg, *filters, exact]
            )
            exhausted, cursor = reply[1] == 1, (_text(reply[2]), _text(reply[3]))
            page = [
                self._decode_task(_text(reply[i]), pairs(reply[i + 1]))
                for i in range(4, len(reply), 2)
            ]
            results.extend(page)
            remaining -= len(page)
            if exhausted:
                break
        return results

    def counts(self) -> dict[TaskStatus, int]:
        key = self.keys.counts
        # The seven status fields only: the hash also holds a counter per (status, bucket).
        raw = self._read(key, lambda c: c.hmget(key, _STATUS_FIELDS))
        result = dict.fromkeys(TaskStatus, 0)
        for status, value in zip(TaskStatus, raw):
            if value is None:
                continue
            try:
                result[status] = int(value)
            except ValueError:
                detail = f"counter {value!r} does not decode"
                raise CorruptRecord(key, status.value, detail) from None
        return result

    # -- audit history ---------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        entry = encode_entry(check.check_transition(transition))
        self._run("append", [self.keys.history(transition.task_id)], [transition.version, entry])

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        check_identifier(task_id, "task_id")
        check_int(since_version, "since_version")
        key = self.keys.history(task_id)
        members: list[bytes] = self._read(
            key,
            lambda c: c.zrangebyscore(key, f"({since_version}", "+inf"),  # type: ignore[arg-type,return-value]
        )
        return [self._decode_entry(task_id, key, m) for m in members]

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
        self._touch(task_id, "", progress, heartbeat_at, lease_owner, lease_until)

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        """``touch`` that applies only while the task's ``status_version`` is
        ``expect_version``; returns whether it applied. A holder whose task was taken over
        (marked LOST, restarted elsewhere) bumps into the new version and writes nothing, so a
        paused "zombie" cannot overwrite the new holder's lease or progress. Never bumps the
        version. A missing task returns False."""
        check_int(expect_version, "expect_version")
        return self._touch(
            task_id, expect_version, progress, heartbeat_at, lease_owner, lease_until
        )

    def _touch(
        self,
        task_id: str,
        fence: int | str,
        progress: Progress | None,
        heartbeat_at: datetime | None,
        lease_owner: str | None,
        lease_until: datetime | None,
    ) -> bool:
        check.check_touch(task_id, progress, heartbeat_at, lease_owner, lease_until)
        columns = touch_columns(progress, heartbeat_at, lease_owner, lease_until)
        if not columns and fence == "":
            self._check_open()
            return True
        writes, deletes = hash_changes(columns, TASK_FIELDS)
        args = [fence, len(deletes), *deletes, *writes]
        reply = self._run("touch", [self.keys.task(task_id)], args)
        return replies.applied(replies.Call("touch"), reply)

    # -- control commands ------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        row = command_to_row(check.check_command(command))
        writes, _ = hash_changes(row, COMMAND_FIELDS)
        k = self.keys
        args = [
            command.command_id,
            write_token(),
            row["created_at"],
            "" if row["lease_until"] is None else row["lease_until"],
            "0" if row["finished_at"] is None else "1",
            *writes,
        ]
        keys = [k.command(command.command_id), k.command_queue, k.command_leases]
        self._run("submit_command", keys, args, command_id=command.command_id)

    def get_command(self, command_id: str) -> Command | None:
        """``CommandReadingStore``: the command as stored, or ``None``."""
        check_identifier(command_id, "command_id")
        key = self.keys.command(command_id)
        fields: dict[bytes, bytes] = self._read(key, lambda c: c.hgetall(key))  # type: ignore[arg-type,return-value]
        return None if not fields else self._decode_command(command_id, fields)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        until = encode_dt(check.check_claim(now, lease_seconds, limit))
        k = self.keys
        memo_ms = max(1000, math.ceil(lease_seconds * 1000))
        memo = k.claim_memo(token())
        keys = [k.command_queue, k.command_leases, memo, k.root, k.audit]
        args = [encode_dt(now), until, limit, memo_ms, self._audit_flag, self.audit_owner]
        reply = self._run("claim_commands", keys, args)
        ids = [_text(reply[i]) for i in range(1, len(reply), 2)]
        try:
            return [self._decode_command(ids[j], pairs(reply[2 + 2 * j])) for j in range(len(ids))]
        except CorruptRecord:
            # The script checks every field it can; a payload is msgpack, which Lua cannot
            # check on every server. Undo the batch so that nothing stays leased, then report.
            for command_id in ids:
                args = [command_id, self._audit_flag, encode_dt(now), self.audit_owner]
                self._command_script("release_command", command_id, args)
            self._read(memo, lambda c: c.delete(memo))
            raise

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        check.check_complete(command_id, now, outcome)
        args = [command_id, encode_dt(now), "0" if outcome is None else "1", outcome or ""]
        args += [self._audit_flag, self.audit_owner]
        self._command_script("complete_command", command_id, args)

    def release_command(self, command_id: str, *, now: datetime) -> None:
        check.check_release(command_id, now)
        args = [command_id, self._audit_flag, encode_dt(now), self.audit_owner]
        self._command_script("release_command", command_id, args)

    # -- operations ------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        keep = check.check_keep_terminal(keep_terminal)
        dropped = 0
        while True:
            reply = self._run("prune", [self.keys.root], [keep, PRUNE_BATCH])
            batch, still_to_drop = int(reply[1]), int(reply[2])
            dropped += batch
            if still_to_drop <= 0 or batch == 0:
                return dropped

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self._client.close()

    # -- script calls and replies ----------------------------------------------------------

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any], **about: Any) -> list[Any]:
        """One script call; a failure code becomes its exception (``_replies.REPLIES``),
        naming what ``about`` says the call was about (``_replies.Call``)."""
        return replies.check(replies.Call(name, **about), self._eval(name, keys, args))

    def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """One script call, its reply as the script gave it (the code made ``str``)."""
        self._check_open()
        script = self._scripts[name]
        with self._errors():
            if name in READ_ONLY_SCRIPTS and not self.legacy_scripts:
                reply = self._evalsha_ro(script, keys, args)
            else:
                reply = script(keys=list(keys), args=list(args))
        reply[0] = _text(reply[0])
        return reply  # type: ignore[no-any-return]

    def _evalsha_ro(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self._client.evalsha_ro(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            script.sha = self._client.script_load(script.script)
            return self._client.evalsha_ro(script.sha, len(keys), *keys, *args)

    def _command_script(self, name: str, command_id: str, args: list[Any]) -> None:
        k = self.keys
        keys = [k.command(command_id), k.command_queue, k.command_leases, k.audit]
        self._run(name, keys, args, command_id=command_id)

    def _read(self, key: str, call: Callable[[redis.Redis], T]) -> T:
        self._check_open()
        with self._errors(key):
            return call(self._client)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed()

    @contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        """Turn redis-py's exceptions into the store's, naming the cause."""
        try:
            yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise StoreUnavailable(f"Redis is unreachable: {exc}") from exc
        except redis.exceptions.OutOfMemoryError as exc:
            # Write scripts carry a '#!lua' shebang, so Redis refuses them whole, before any
            # write, when it is over maxmemory (no half-applied script).
            raise StoreError(f"Redis refused the write, out of memory: {exc}") from exc
        except redis.exceptions.NoPermissionError as exc:
            raise StoreError(f"Redis refused the command (ACL): {exc}") from exc
        except redis.exceptions.ResponseError as exc:
            message = str(exc)
            if message.startswith("WRONGTYPE") and key is not None:
                raise CorruptRecord(key, None, message) from exc
            raise StoreError(f"Redis error: {message}") from exc
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis error: {exc}") from exc

    # -- encoding --------------------------------------------------------------------------

    def _task_args(
        self, row: Row, expect: int | str, *, with_lease: bool = False, counted: bool = False
    ) -> list[Any]:
        """create writes the whole task, lease included; save never writes the lease.
        ``counted``: the pairs are preceded by their number (commit_tasks' layout). A create
        (``expect == ""``) sends no deletions: a new hash has nothing to delete."""
        skip = ("task_id",) if with_lease else ("task_id", *LEASE_COLUMNS)
        columns = {c: v for c, v in row.items() if c not in skip}
        writes, deletes = task_hash_changes(columns, TASK_FIELDS)
        if expect == "":
            deletes = []
        count = [len(writes) // 2] if counted else []
        return [row["task_id"], write_token(), expect, len(deletes), *deletes, *count, *writes]

    def _decode_task(self, task_id: str, fields: dict[bytes, bytes]) -> TaskSnapshot:
        snapshot = fast_snapshot(task_id, fields)
        if snapshot is not None:
            return snapshot
        key = self.keys.task(task_id)
        row: dict[str, Primitive] = {"task_id": task_id}
        for field, value in fields.items():
            column = TASK_COLUMNS_BY_FIELD.get(_text(field, key))
            if column is not None:
                row[column] = value
        try:
            return row_to_snapshot(row)
        except RowError as exc:
            raise CorruptRecord(key, field_of(exc.column, TASK_FIELDS), exc.detail) from None

    def _decode_command(self, command_id: str, fields: dict[bytes, bytes]) -> Command:
        key = self.keys.command(command_id)
        row: dict[str, Primitive] = {}
        for field, value in fields.items():
            column = COMMAND_COLUMNS_BY_FIELD.get(_text(field, key))
            if column is not None:
                row[column] = value
        try:
            return row_to_command(row)
        except RowError as exc:
            raise CorruptRecord(key, field_of(exc.column, COMMAND_FIELDS), exc.detail) from None

    def _decode_entry(self, task_id: str, key: str, member: bytes) -> Transition:
        return decode_entry(task_id, key, member)
