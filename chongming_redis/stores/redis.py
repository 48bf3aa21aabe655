"""``RedisTaskStore``: the ``TaskStore`` protocol on Redis, one Lua script per operation.

Every write is one ``EVALSHA`` of a script from ``lua/`` that validates everything, then writes
the task, its indexes and counters together, so they can never disagree. Reads are plain
``HGETALL``/``ZRANGEBYSCORE`` calls, or the read-only ``query`` script (``EVALSHA_RO``). The
layout is documented in ``docs/redis-layout.md`` and built in ``_redis/keys.py`` alone.

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
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

from chongming_redis.errors import CorruptRecord, StoreClosed
from chongming_redis.model import Command, Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores import _checks as check
from chongming_redis.stores._redis import durability, ops, replies
from chongming_redis.stores._redis.cluster import ClusterCalls, connect_cluster
from chongming_redis.stores._redis.connect import connect
from chongming_redis.stores._redis.extensions import RedisExtensions
from chongming_redis.stores._redis.keys import TASK_FIELDS, Keys
from chongming_redis.stores._redis.ops import QUERY_BUDGET, QUERY_PAGE
from chongming_redis.stores._redis.replies import text as _text
from chongming_redis.stores._redis.rows import encode_entry, hash_changes, pairs, token
from chongming_redis.stores._redis.scripts import READ_ONLY_SCRIPTS, SCRIPT_NAMES, script_text
from chongming_redis.stores._redis.server import check_server_settings, supports_script_flags
from chongming_redis.stores.codec import Row, encode_dt, snapshot_to_row, touch_columns
from chongming_redis.validation import check_int

__all__ = ["PRUNE_BATCH", "QUERY_BUDGET", "QUERY_PAGE", "RedisTaskStore"]

log = logging.getLogger("chongming_redis.store")

T = TypeVar("T")

#: Tasks ``prune`` drops per script call (each call stays well under a millisecond per task).
#: (``QUERY_PAGE``/``QUERY_BUDGET``, the ``query`` page sizes, come from ``_redis.ops``; the
#: store reads them from this module at each call.)
PRUNE_BATCH = 100


class RedisTaskStore(RedisExtensions):
    """A ``TaskStore`` on one Redis database, isolated by ``namespace``.

    ``client`` must be a ``redis.Redis`` created with ``decode_responses=False`` (values are
    binary). Use ``from_url`` to get one with bounded timeouts and retries.
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        namespace: str,
        check_server: bool = True,
        owns_client: bool = False,
        audit: bool = False,
        audit_owner: str | None = None,
        durability_replicas: int = 0,
        durability_timeout: float | None = None,
    ) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisTaskStore needs a client with decode_responses=False")
        self.keys = Keys(namespace)
        #: On Redis Cluster: the calls routed to the namespace's slot (``_redis.cluster``).
        self._cluster = ClusterCalls.of(client, self.keys.root)
        #: ``durability_replicas``: writes wait for replicas (``_redis.durability``)
        self.wait_rule = durability.wait_rule(
            durability_replicas, durability_timeout,
            client.get_connection_kwargs().get("socket_timeout"),
            durability.barrier(self.keys, cluster=self._cluster is not None),
        )  # fmt: skip
        self._client: redis.Redis = client  # type: ignore[assignment]  # same commands
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
        with ops.errors():
            self.legacy_scripts = not (
                self._cluster.supports_script_flags() if self._cluster else
                supports_script_flags(self._client)
            )  # fmt: skip
            self._scripts: dict[str, Script] = {
                name: client.register_script(script_text(name, legacy=self.legacy_scripts))
                for name in SCRIPT_NAMES
            }
            if check_server and self._cluster:
                self._cluster.check_server_settings()
            elif check_server:
                check_server_settings(self._client)
            if self.wait_rule is not None:
                durability.check_replicas(self._cluster.master() if self._cluster else
                                          self._client, self.wait_rule)  # fmt: skip

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
        durability_replicas: int = 0,
        durability_timeout: float | None = None,
        cluster: bool = False,
        **options: Any,
    ) -> RedisTaskStore:
        """Connect to ``url`` (``redis://``, ``rediss://``, ``unix://``, or
        ``redis+sentinel://host:port[,host:port...]/service[/db]``: the primary Sentinel names,
        followed across failovers; ``_redis.sentinel``).

        A call fails with ``StoreUnavailable`` after at most about
        ``(retries + 1) * (socket_timeout + socket_connect_timeout)`` seconds, never hangs.
        ``durability_replicas=N``: a write is acknowledged only once ``N`` replicas confirmed
        it, within ``durability_timeout`` seconds (default: half the socket timeout), else it
        raises ``StoreUnavailable`` (``_redis.durability``).
        ``cluster=True``: ``url`` names a node of a Redis Cluster (``_redis.cluster``).
        """
        Keys(namespace)  # refuse a bad namespace, and bad durability options, before connecting
        durability.wait_rule(durability_replicas, durability_timeout, socket_timeout, ())
        make = connect_cluster if cluster else connect
        client = make(url, socket_timeout=socket_timeout, retries=retries,
                         socket_connect_timeout=socket_connect_timeout, **options)  # fmt: skip
        return cls(
            client,
            namespace=namespace,
            check_server=check_server,
            owns_client=True,
            audit=audit,
            audit_owner=audit_owner,
            durability_replicas=durability_replicas,
            durability_timeout=durability_timeout,
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
        return self._perform(ops.get_task(self.keys, task_id))

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        # The page sizes are read here, so that a test may change this module's constants.
        plan = ops.query(self.keys, query, page_size=QUERY_PAGE, page_budget=QUERY_BUDGET)
        return self._perform(plan)

    def query_page(
        self, query: TaskQuery | None = None, *, after: tuple[datetime, str] | None = None
    ) -> list[TaskSnapshot]:
        """``PagedQueryStore``: ``query`` resumed strictly after ``after = (created_at,
        task_id)``; the first script call starts from that cursor (``_redis.ops.query``)."""
        plan = ops.query(
            self.keys, query, page_size=QUERY_PAGE, page_budget=QUERY_BUDGET, after=after
        )
        return self._perform(plan)

    def counts(self) -> dict[TaskStatus, int]:
        return self._perform(ops.counts(self.keys))

    # -- audit history ---------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        entry = encode_entry(check.check_transition(transition))
        self._run("append", [self.keys.history(transition.task_id)], [transition.version, entry])

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        return self._perform(ops.history(self.keys, task_id, since_version))

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
        self._perform(ops.submit_command(self.keys, command))

    def get_command(self, command_id: str) -> Command | None:
        """``CommandReadingStore``: the command as stored, or ``None``."""
        return self._perform(ops.get_command(self.keys, command_id))

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
            reply = self._run("prune", [self.keys.root, self.keys.counts], [keep, PRUNE_BATCH])
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

    def _perform(self, plan: ops.Plan[T]) -> T:
        """Run an operation of ``_redis.ops`` with this store's I/O (see its docstring)."""
        reply: Any = None
        requested = False
        while True:
            try:
                request = plan.send(reply)
            except StopIteration as done:
                if not requested:
                    self._check_open()
                return done.value  # type: ignore[no-any-return]
            requested = True
            reply = self._request(request)

    def _request(self, request: ops.Request) -> Any:
        if isinstance(request, ops.Read) and self._cluster:
            read = partial(self._cluster.read, self.wait_rule, request.method, request.args)
            return self._read(request.key, lambda c: read())
        if isinstance(request, ops.Read):
            call = partial(durability.write_or_read, self.wait_rule, request.method, request.args)
            return self._read(request.key, call)
        return replies.check(request.call, self._eval(request.name, request.keys, request.args))

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any], **about: Any) -> list[Any]:
        """One script call; a failure code becomes its exception (``_redis.replies.REPLIES``),
        naming what ``about`` says the call was about (``_redis.replies.Call``)."""
        return replies.check(replies.Call(name, **about), self._eval(name, keys, args))

    def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """One script call, its reply as the script gave it (the code made ``str``)."""
        self._check_open()
        script = self._scripts[name]
        with ops.errors():
            if self._cluster is not None:
                rule = None if name in READ_ONLY_SCRIPTS else self.wait_rule
                reply = self._cluster.eval(script, keys, args, rule)
            elif name in READ_ONLY_SCRIPTS and not self.legacy_scripts:
                reply = self._evalsha_ro(script, keys, args)
            elif self.wait_rule is not None and name not in READ_ONLY_SCRIPTS:
                reply = self.wait_rule.evalsha(self._client, script, list(keys), list(args))
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
        with ops.errors(key):
            if self._cluster is not None:  # again while the slot migrates (TRYAGAIN)
                return self._cluster.call(lambda: call(self._client))
            return call(self._client)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed()

    # -- encoding (``_redis.ops``) ---------------------------------------------------------

    def _task_args(
        self, row: Row, expect: int | str, *, with_lease: bool = False, counted: bool = False
    ) -> list[Any]:
        return ops.task_args(row, expect, with_lease=with_lease, counted=counted)

    def _decode_task(self, task_id: str, fields: dict[bytes, bytes]) -> TaskSnapshot:
        return ops.decode_task(self.keys, task_id, fields)

    def _decode_command(self, command_id: str, fields: dict[bytes, bytes]) -> Command:
        return ops.decode_command(self.keys, command_id, fields)
