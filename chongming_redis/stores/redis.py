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
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import msgpack
import redis
from redis.backoff import ExponentialBackoff
from redis.commands.core import Script
from redis.retry import Retry

from chongming_redis.errors import CorruptRecord, StoreClosed, StoreError, StoreUnavailable
from chongming_redis.model import (
    ChangePage,
    Command,
    FeedStats,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Tombstone,
    Transition,
)
from chongming_redis.stores import _common as check
from chongming_redis.stores import _replies as replies
from chongming_redis.stores._feed import check_page_limit, decode_tombstone, page_of, parse_cursor
from chongming_redis.stores._keys import (
    COMMAND_COLUMNS_BY_FIELD,
    COMMAND_FIELDS,
    TASK_COLUMNS_BY_FIELD,
    TASK_FIELDS,
    Keys,
)
from chongming_redis.stores._replies import text as _text
from chongming_redis.stores._scripts import READ_ONLY_SCRIPTS, SCRIPT_NAMES, script_text
from chongming_redis.stores.codec import (
    LEASE_COLUMNS,
    Primitive,
    Row,
    RowError,
    command_to_row,
    decode_dt,
    encode_dt,
    row_to_command,
    row_to_snapshot,
    row_to_transition,
    snapshot_to_row,
    touch_columns,
    transition_to_row,
)
from chongming_redis.validation import check_identifier, check_int

log = logging.getLogger("chongming_redis.store")

T = TypeVar("T")

#: Matches returned per ``query`` script call, and entries examined when filters remain.
QUERY_PAGE = 500
QUERY_BUDGET = 1000
#: Tasks ``prune`` drops per script call (each call stays well under a millisecond per task).
PRUNE_BATCH = 100


class RedisTaskStore:
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
            self.legacy_scripts = not _supports_script_flags(client)
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
        source_kind, source_arg = _choose_source(q)
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
                self._decode_task(_text(reply[i]), _pairs(reply[i + 1]))
                for i in range(4, len(reply), 2)
            ]
            results.extend(page)
            remaining -= len(page)
            if exhausted:
                break
        return results

    def counts(self) -> dict[TaskStatus, int]:
        key = self.keys.counts
        raw = self._read(key, lambda c: c.hgetall(key))
        result = dict.fromkeys(TaskStatus, 0)
        for field, value in raw.items():
            name = _text(field)
            if ":" in name:
                continue  # per-bucket counters
            try:
                result[TaskStatus(name)] = int(value)
            except ValueError:
                raise CorruptRecord(key, name, f"counter {value!r} does not decode") from None
        return result

    # -- audit history ---------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        entry = _entry(check.check_transition(transition))
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
        writes, deletes = _hash_changes(columns, TASK_FIELDS)
        args = [fence, len(deletes), *deletes, *writes]
        reply = self._run("touch", [self.keys.task(task_id)], args)
        return replies.applied(replies.Call("touch"), reply)

    # -- runtime extensions: batched starts and commits (one round trip each) --------------

    def start_tasks(
        self,
        *,
        owner: str,
        now: datetime,
        lease_until: datetime,
        buckets: Sequence[int],
        limit: int = 50,
        names: Sequence[str] = (),
    ) -> list[TaskSnapshot]:
        """Start up to ``limit`` ``PENDING`` tasks of ``buckets`` whose ``not_before`` has
        passed, oldest first: for each, the compare-and-set to ``RUNNING``, the lease, the
        heartbeat and the history entry, all in one script (``lua/start_tasks.lua``). Returns
        the started tasks as stored. ``names``: only tasks of these types (empty: any)."""
        wanted, names = check.check_start(owner, now, lease_until, buckets, limit, names)
        token = _token()
        memo_ms = max(1000, math.ceil((lease_until - now).total_seconds() * 1000))
        keys = [self.keys.root, self.keys.start_memo(token)]
        args = [owner, encode_dt(now), encode_dt(lease_until), limit, token, memo_ms,
                len(wanted), *wanted, len(names), *names]  # fmt: skip
        reply = self._run("start_tasks", keys, args)
        return [
            self._decode_task(_text(reply[i]), _pairs(reply[i + 1]))
            for i in range(1, len(reply), 2)
        ]

    def commit_tasks(
        self, items: Sequence[tuple[TaskSnapshot, int | None, Sequence[Transition]]]
    ) -> list[StoreError | None]:
        """Save each snapshot (compare-and-set on its expected version, never the lease) and
        append its transitions: one round trip per 100 items (``lua/commit_tasks.lua``). An
        expected version of ``None`` creates the task instead (with its lease, as ``create``).
        Returns, per item, ``None`` when written (or already written by a retried call), or
        the ``ConcurrencyConflict`` / ``TaskAlreadyExists`` it met; such an item writes nothing.
        Items must name distinct tasks (each is checked against the state before the call).
        The full contract: ``BatchingStore.commit_tasks`` (``stores/extensions.py``)."""
        checked = check.check_commit_items(items)  # every item, before the first batch
        self._check_open()
        results: list[StoreError | None] = []
        for start in range(0, len(checked), 100):
            batch = checked[start : start + 100]
            args: list[Any] = [len(batch)]
            for snapshot, expect, transitions in batch:
                row = snapshot_to_row(snapshot)
                if expect is None:
                    args += self._task_args(row, "", with_lease=True, counted=True)
                else:
                    args += self._task_args(row, expect, counted=True)
                args.append(len(transitions))
                for transition in transitions:
                    args += [transition.version, _entry(transition)]
            reply = self._run("commit_tasks", [self.keys.root], args)
            for i, (snapshot, expect, _) in enumerate(batch):
                item = replies.Call("commit_tasks", task_id=snapshot.task_id, expected=expect or 0)
                results.append(replies.item_error(item, reply[1 + 2 * i], reply[2 + 2 * i]))
        return results

    def server_time(self) -> datetime:
        """The Redis server's clock (``TIME``): the one clock every worker agrees on."""
        seconds, micros = self._read(self.keys.root, lambda c: c.time())
        return decode_dt(int(seconds) * 1_000_000 + int(micros))

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        """``{bucket: {status: n}}`` from the counters, without reading any task."""
        key = self.keys.counts
        raw = self._read(key, lambda c: c.hgetall(key))
        result: dict[int, dict[TaskStatus, int]] = {}
        for field, value in raw.items():
            status, _, bucket = _text(field).partition(":")
            if bucket:
                per = result.setdefault(int(bucket), dict.fromkeys(TaskStatus, 0))
                per[TaskStatus(status)] = int(value)
        return result

    def pool_tick(
        self,
        *,
        worker: str,
        now: datetime,
        lease_seconds: float,
        num_buckets: int,
        wanted: Sequence[int],
        leaving: bool = False,
    ) -> tuple[list[int], list[str]]:
        """One worker's heartbeat and bucket leases in one step (``lua/pool_tick.lua``).
        Returns ``(buckets this worker now holds, live workers)``; raises ``StoreError`` when
        the namespace recorded another ``num_buckets``."""
        k = self.keys
        keys = [k.workers, k.bucket_owner, k.bucket_until, k.meta]
        now_ms = encode_dt(now) // 1000
        args = [worker, now_ms, max(1, round(lease_seconds * 1000)), num_buckets,
                "1" if leaving else "0", len(wanted), *wanted]  # fmt: skip
        reply = self._run(
            "pool_tick", keys, args, namespace=self.namespace, num_buckets=num_buckets
        )
        return [int(b) for b in reply[1]], [_text(w) for w in reply[2]]

    def pool_state(self) -> tuple[dict[str, datetime], dict[int, str]]:
        """``({worker: heartbeat expiry}, {bucket: owner})`` as the pool last wrote them."""
        k = self.keys
        workers: list[tuple[bytes, float]] = self._read(
            k.workers,
            lambda c: c.zrange(k.workers, 0, -1, withscores=True),  # type: ignore[arg-type,return-value]
        )
        owners: dict[bytes, bytes] = self._read(
            k.bucket_owner,
            lambda c: c.hgetall(k.bucket_owner),  # type: ignore[arg-type,return-value]
        )
        return (
            {_text(w): decode_dt(int(score) * 1000) for w, score in workers},
            {int(b): _text(w) for b, w in owners.items()},
        )

    @property
    def client(self) -> redis.Redis:
        """The redis-py client (for the runtime's pub/sub nudges)."""
        return self._client

    # -- the change feed -------------------------------------------------------------------

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        """One page of the change feed (``ChangeFeed.changes``; ``lua/changes.lua``)."""
        position, size = parse_cursor(after), check_page_limit(limit)
        reply = self._run("changes", [self.keys.root], [position, size], after=position)
        items: list[TaskSnapshot | Tombstone] = []
        for i in range(2, len(reply), 3):
            value: bytes = reply[i + 1]
            if value[:1] == b"t":
                items.append(self._decode_task(_text(value[1:]), _pairs(reply[i + 2])))
            else:
                chunk = self.keys.feed_chunk(int(reply[i]) // 128)
                items.append(decode_tombstone(value[1:], chunk))
        last = int(reply[len(reply) - 3]) if items else None
        return page_of(items, last, position)

    def feed_stats(self) -> FeedStats:
        """The feed's head, size (live tasks + tombstones) and tombstone count."""
        key = self.keys.feed
        head, tombs = self._read(key, lambda c: c.hmget(key, "head", "tombs"))
        tasks = sum(self.counts().values())
        tombstones = int(tombs or 0)
        return FeedStats(int(head or 0), tasks + tombstones, tombstones)

    # -- control commands ------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        row = command_to_row(check.check_command(command))
        writes, _ = _hash_changes(row, COMMAND_FIELDS)
        k = self.keys
        args = [
            command.command_id,
            _token(),
            row["created_at"],
            "" if row["lease_until"] is None else row["lease_until"],
            "0" if row["finished_at"] is None else "1",
            *writes,
        ]
        keys = [k.command(command.command_id), k.command_queue, k.command_leases]
        self._run("submit_command", keys, args, command_id=command.command_id)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        until = encode_dt(check.check_claim(now, lease_seconds, limit))
        k = self.keys
        memo_ms = max(1000, math.ceil(lease_seconds * 1000))
        memo = k.claim_memo(_token())
        keys = [k.command_queue, k.command_leases, memo, k.root, k.audit]
        args = [encode_dt(now), until, limit, memo_ms, self._audit_flag, self.audit_owner]
        reply = self._run("claim_commands", keys, args)
        ids = [_text(reply[i]) for i in range(1, len(reply), 2)]
        try:
            return [self._decode_command(ids[j], _pairs(reply[2 + 2 * j])) for j in range(len(ids))]
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
            reply = self._run("prune", [self.keys.term, self.keys.root], [keep, PRUNE_BATCH])
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
        ``counted``: the pairs are preceded by their number (commit_tasks' layout)."""
        skip = ("task_id",) if with_lease else ("task_id", *LEASE_COLUMNS)
        columns = {c: v for c, v in row.items() if c not in skip}
        writes, deletes = _hash_changes(columns, TASK_FIELDS)
        count = [len(writes) // 2] if counted else []
        return [row["task_id"], _token(), expect, len(deletes), *deletes, *count, *writes]

    def _decode_task(self, task_id: str, fields: dict[bytes, bytes]) -> TaskSnapshot:
        key = self.keys.task(task_id)
        row: dict[str, Primitive] = {"task_id": task_id}
        for field, value in fields.items():
            column = TASK_COLUMNS_BY_FIELD.get(_text(field, key))
            if column is not None:
                row[column] = value
        try:
            return row_to_snapshot(row)
        except RowError as exc:
            raise CorruptRecord(key, _field_of(exc.column, TASK_FIELDS), exc.detail) from None

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
            raise CorruptRecord(key, _field_of(exc.column, COMMAND_FIELDS), exc.detail) from None

    def _decode_entry(self, task_id: str, key: str, member: bytes) -> Transition:
        try:
            values = msgpack.unpackb(member, raw=False)
            if not isinstance(values, list) or len(values) != len(_ENTRY_COLUMNS):
                raise RowError(None, "history entry is not a list of the expected length")
            for i in (1, 2):
                values[i] = _STATUS_NAMES.get(values[i], values[i])
            return row_to_transition({"task_id": task_id, **dict(zip(_ENTRY_COLUMNS, values))})
        except RowError as exc:
            raise CorruptRecord(key, exc.column, exc.detail) from None
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise CorruptRecord(key, None, f"history entry does not decode: {exc}") from None


_ENTRY_COLUMNS = ("version", "from_status", "to_status", "at", "reason")


#: Statuses inside history entries are one letter: an entry of at most 64 bytes keeps a
#: task's history sorted set in Redis's compact listpack encoding (~1 KB less per task).
_STATUS_CODES = {
    "pending": "P", "running": "R", "paused": "Z", "succeeded": "S", "failed": "F",
    "stopped": "X", "lost": "L",
}  # fmt: skip
_STATUS_NAMES = {code: name for name, code in _STATUS_CODES.items()}


def _entry(transition: Transition) -> bytes:
    """A history entry as stored: msgpack ``[version, from, to, at_us, reason]``, statuses
    as ``_STATUS_CODES``."""
    row = transition_to_row(transition)
    values = [row[c] for c in _ENTRY_COLUMNS]
    values[1] = None if values[1] is None else _STATUS_CODES[str(values[1])]
    values[2] = _STATUS_CODES[str(values[2])]
    return bytes(msgpack.packb(values, use_bin_type=True))


def _choose_source(q: TaskQuery) -> tuple[str, str]:
    """The index to walk: the most selective one the query names."""
    if q.pipeline_run_id is not None:
        return "p", q.pipeline_run_id
    if q.tag is not None:
        return "tag", q.tag
    return "ix", ""


def _hash_changes(columns: Row, fields: dict[str, str]) -> tuple[list[Any], list[str]]:
    """Field/value pairs to write and field names to delete (columns that are ``None``)."""
    writes: list[Any] = []
    deletes: list[str] = []
    for column, value in columns.items():
        field = fields[column]
        if value is None:
            deletes.append(field)
        else:
            writes += [field, repr(value) if type(value) is float else value]
    return writes, deletes


def _field_of(column: str | None, fields: dict[str, str]) -> str | None:
    return None if column is None else fields.get(column, column)


def _token() -> str:
    return secrets.token_urlsafe(9)


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2]))


def _supports_script_flags(client: redis.Redis) -> bool:
    """Redis >= 7 understands ``#!lua`` shebangs and ``EVALSHA_RO``; older servers and
    fakeredis do not (and fakeredis changes its reply shapes after HELLO, so it is not
    asked)."""
    if type(client).__module__.startswith("fakeredis"):
        return False
    try:
        hello = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except redis.exceptions.ResponseError:
        return False
    info = dict(zip(hello[::2], hello[1::2])) if isinstance(hello, list) else hello
    server = _text(info.get(b"server", b""))
    version = _text(info.get(b"version", b"0"))
    if server != "redis":
        return False
    return int(version.split(".")[0]) >= 7


def check_server_settings(client: redis.Redis) -> list[str]:
    """Warn (log) when the server can lose or evict acknowledged data; return the warnings.

    Reads only INFO; where the ACL forbids it the check is skipped with a log line.
    """
    try:
        memory = client.info("memory")
        persistence = client.info("persistence")
    except redis.exceptions.NoPermissionError:
        log.info("server settings not checked: this user may not run INFO")
        return []
    except redis.exceptions.ResponseError as exc:
        log.info("server settings not checked: %s", exc)
        return []
    problems = []
    policy = memory.get("maxmemory_policy")
    if policy is not None and policy != "noeviction":
        problems.append(
            f"maxmemory-policy is {policy!r}: Redis may evict task keys under memory pressure; "
            "set it to 'noeviction'"
        )
    if persistence.get("aof_enabled") == 0:
        problems.append(
            "appendonly is off: acknowledged writes can be lost when Redis restarts; "
            "use appendonly yes with appendfsync always for crash durability"
        )
    for problem in problems:
        log.warning("chongming-redis: %s", problem)
    return problems
