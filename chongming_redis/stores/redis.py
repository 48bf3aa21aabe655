"""``RedisTaskStore``: the ``TaskStore`` protocol on Redis, one Lua script per operation.

Every write is one ``EVALSHA`` of a script from ``lua/`` that validates everything, then writes
the task, its indexes and counters together, so they can never disagree. Reads are plain
``HGETALL``/``ZRANGEBYSCORE`` calls, or the read-only ``query`` script (``EVALSHA_RO``). The
layout is documented in ``docs/redis-layout.md`` and built in ``_redis/keys.py`` alone. Each
operation is a plan, built without I/O (``_redis.ops``, ``_redis.worker_ops``,
``_redis.dashboard_ops``), that this store drives with redis-py, by the rules it shares with
``AsyncRedisTaskStore`` (``_redis.driver``).

Retries: redis-py re-sends a command whose connection failed, even if the server ran it (the
reply was lost, not the command). Each write therefore carries a token the script recognises:
a retried ``create``/``save``/``submit_command`` whose first attempt landed reports success, a
retried ``claim_commands`` returns the batch the first attempt leased, and ``append``, ``touch``,
``complete_command`` and ``release_command`` are idempotent by nature.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

from chongming_redis.model import Command, Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores._redis import driver, durability, ops, replies, worker_ops
from chongming_redis.stores._redis.cluster import ClusterCalls, connect_cluster
from chongming_redis.stores._redis.connect import connect
from chongming_redis.stores._redis.extensions import RedisExtensions
from chongming_redis.stores._redis.ops import QUERY_BUDGET, QUERY_PAGE
from chongming_redis.stores._redis.rows import decode_command, task_args
from chongming_redis.stores._redis.scripts import SCRIPT_NAMES, script_text
from chongming_redis.stores._redis.server import check_server_settings, supports_script_flags
from chongming_redis.stores._redis.task_schemas import RedisTaskSchemas
from chongming_redis.stores._redis.worker_ops import PRUNE_BATCH
from chongming_redis.stores.codec import Row

__all__ = ["PRUNE_BATCH", "QUERY_BUDGET", "QUERY_PAGE", "RedisTaskStore"]

log = logging.getLogger("chongming_redis.store")

T = TypeVar("T")

# ``PRUNE_BATCH`` (tasks per ``prune`` script call) and ``QUERY_PAGE``/``QUERY_BUDGET`` (the
# ``query`` page sizes) come from ``_redis.worker_ops`` and ``_redis.ops``; the store reads
# them from this module at each call, so that a test may change them here.


class RedisTaskStore(RedisTaskSchemas, RedisExtensions):
    """A ``TaskStore`` on one Redis database, isolated by ``namespace``.

    ``client`` must be a ``redis.Redis`` created with ``decode_responses=False`` (values are
    binary). Use ``from_url`` to get one with bounded timeouts and retries.
    """

    legacy_scripts: bool

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
        super().__init__(client, ClusterCalls.of, namespace=namespace, owns_client=owns_client,
                         durability_replicas=durability_replicas,
                         durability_timeout=durability_timeout)  # fmt: skip
        self._client: redis.Redis = client  # type: ignore[assignment]  # same commands
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
        driver.check_before_connecting(namespace, durability_replicas, durability_timeout,
                                       socket_timeout)  # fmt: skip
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

    # -- task snapshots --------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        self._perform(worker_ops.create(self.keys, snapshot))

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        self._perform(worker_ops.save(self.keys, snapshot, expect_version))

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
        self._perform(worker_ops.append(self.keys, transition))

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
        changes = (progress, heartbeat_at, lease_owner, lease_until)
        self._perform(worker_ops.touch(self.keys, task_id, changes))

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
        changes = (progress, heartbeat_at, lease_owner, lease_until)
        return self._perform(worker_ops.touch_fenced(self.keys, task_id, expect_version, changes))

    # -- control commands ------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        self._perform(ops.submit_command(self.keys, command))

    def get_command(self, command_id: str) -> Command | None:
        """``CommandReadingStore``: the command as stored, or ``None``."""
        return self._perform(ops.get_command(self.keys, command_id))

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        plan = worker_ops.claim_commands(self.keys, now, lease_seconds, limit, self._audit())
        return self._perform(plan)

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        plan = worker_ops.complete_command(self.keys, command_id, now, outcome, self._audit())
        self._perform(plan)

    def release_command(self, command_id: str, *, now: datetime) -> None:
        self._perform(worker_ops.release_command(self.keys, command_id, now, self._audit()))

    def _audit(self) -> worker_ops.Audit:
        return worker_ops.Audit(self._audit_flag, self.audit_owner)

    # -- operations ------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        return self._perform(worker_ops.prune(self.keys, keep_terminal, batch=PRUNE_BATCH))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self._client.close()

    # -- I/O: the requests of a plan (``_redis.driver``) -----------------------------------

    def _perform(self, plan: ops.Plan[T]) -> T:
        """Run an operation of ``_redis.ops`` with this store's I/O (see its docstring)."""
        run = driver.Run(plan, self._check_open)
        request = run.start()
        while request is not None:
            request = run.send(self._request(request))
        return run.result

    def _request(self, request: ops.Request) -> Any:
        if isinstance(request, ops.Script):
            return self._run(request.name, request.keys, request.args, **request.about)
        return self._read(request)

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any], **about: Any) -> list[Any]:
        """One script call; a failure code becomes its exception (``_redis.replies.REPLIES``),
        naming what ``about`` says the call was about (``_redis.replies.Call``)."""
        return replies.check(replies.Call(name, **about), self._eval(name, keys, args))

    def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """One script call, its reply as the script gave it (the code made ``str``)."""
        with ops.errors():
            script = self._script(name)
            reply = self._sender(name)(script, list(keys), list(args))
        return driver.coded(reply)

    def _read(self, request: ops.Read | ops.Transaction) -> Any:
        """A plain command (one that writes waits for replicas: ``_redis.durability``) or a
        transaction; on Redis Cluster sent again while the slot migrates (TRYAGAIN)."""
        call: Callable[[], Any]
        if isinstance(request, ops.Transaction):
            call = partial(driver.transaction, self._client, request)
        elif self._cluster is not None:
            call = partial(self._cluster.read, self.wait_rule, request.method, request.args)
        else:
            call = partial(durability.write_or_read, self.wait_rule, request.method,
                           request.args, self._client)  # fmt: skip
        with ops.errors(request.key):
            return call() if self._cluster is None else self._cluster.call(call)

    def _script(self, name: str) -> Script:
        return self._scripts[name]

    def _evalsha_ro(self, script: Script, keys: list[Any], args: list[Any]) -> Any:
        try:
            return self._client.evalsha_ro(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            script.sha = self._client.script_load(script.script)
            return self._client.evalsha_ro(script.sha, len(keys), *keys, *args)

    def _evalsha_waiting(
        self, rule: durability.WaitForReplicas, script: Script, keys: list[Any], args: list[Any]
    ) -> Any:
        return rule.evalsha(self._client, script, keys, args)

    # -- encoding (``_redis.rows``: what the plans use, for a caller that sends raw scripts) --

    def _task_args(
        self, row: Row, expect: int | str, *, with_lease: bool = False, counted: bool = False
    ) -> list[Any]:
        return task_args(row, expect, with_lease=with_lease, counted=counted)

    def _decode_command(self, command_id: str, fields: dict[bytes, bytes]) -> Command:
        return decode_command(self.keys, command_id, fields)
