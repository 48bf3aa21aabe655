"""``durability_replicas``: a write is acknowledged only once ``N`` replicas have it.

Redis replicates asynchronously: a write the primary acknowledged can be lost when a replica
that never received it is promoted (a forced failover). With ``RedisTaskStore(...,
durability_replicas=N)`` every write call is sent as one non-transactional pipeline on one
connection (on Redis Cluster, a connection to the master of the namespace's slot:
``_redis.cluster``)::

    EVALSHA <script> ...        the write itself
    PUBLISH {ns}:nudge:!wait    a barrier (below); on Redis Cluster SET {ns}:wait ""
    WAIT N <timeout ms>         how many replicas have everything this connection wrote

and its reply, whatever it says (written, already written, conflict), is returned only when
``WAIT`` counted ``N`` replicas; otherwise the call raises ``StoreUnavailable``: the write may
be on the primary and not on the replicas, so its outcome is unknown. Retrying is safe: a
retried call is recognised as already applied (the scripts' write tokens and retry memos), and
its own ``WAIT`` then covers the first attempt's write (the barrier).

Why the barrier: ``WAIT`` counts the replicas that reached the offset of *this connection's*
last propagated write. A call that writes nothing (an ``append`` or a retried ``save`` that
finds its write already applied, a conflict) would leave that offset behind the state its reply
describes, e.g. on the fresh connection of a redis-py retry whose first attempt's reply was lost.
``PUBLISH`` is always propagated to replicas, so after it the connection's offset is the
primary's current one: a confirmed ``WAIT`` then means the replicas hold everything the reply
rests on. Nobody subscribes to the channel; it lies under the namespace's nudge channels, so an
ACL that allows the nudges allows it. On Redis Cluster ``PUBLISH`` goes over the cluster bus,
not into the replication stream, so the barrier there is a ``SET`` of a tiny key in the
namespace's slot (``Keys.wait_barrier_key``: a write is always propagated, and the key being in
the slot keeps the barrier on the node that ran the script).

A reply that says the command did not run on this node (``MOVED``, ``ASK``, ``TRYAGAIN``,
``CLUSTERDOWN``: ``NOT_RUN_HERE``) is raised, never judged: the ``WAIT`` after it counts
replicas of nothing. The caller refreshes its slot map and sends the whole call again.

What it does not promise (Redis's own words: ``WAIT`` is best effort): a replica that
acknowledged can still be passed over by a failover that promotes another one, and a
replica's copy is in its memory, not necessarily on its disk. Reads are not followed by
``WAIT``: a read can see a write of another client that is not replicated yet.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from redis.commands.core import AsyncScript, Script

from chongming_redis.errors import StoreUnavailable
from chongming_redis.stores._redis.keys import Keys

log = logging.getLogger("chongming_redis.store")

#: The ``WAIT`` timeout when none is given and the client has no socket timeout (seconds).
DEFAULT_WAIT_TIMEOUT = 2.5

#: Plain commands (``_redis.ops.Read``) that write: they are followed by ``WAIT`` too.
WRITING_READS = frozenset({"sadd"})

#: Replies that say the command did not run on the node that got it: the slot is elsewhere
#: (``MOVED``), migrating (``ASK``, ``TRYAGAIN``) or the cluster is down. Never a success.
NOT_RUN_HERE = (
    redis.exceptions.AskError,  # MovedError is one
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)


class PrimaryDemoted(redis.exceptions.ConnectionError):
    """``WAIT`` was cut short (``UNBLOCKED``) because the server stopped being a primary: a
    failover. The write may or may not be on the new primary; as after a lost connection, the
    call is sent again (to the new primary, on Redis Cluster: ``ClusterCalls.on_master``) or
    reported as ``StoreUnavailable``. Retrying is safe."""


#: One command of a pipeline, as its name and arguments.
RawCommand = tuple[Any, ...]
#: Sends commands in one round trip on one connection; returns their replies, a refused
#: command's as an exception object.
Send = Callable[[list[RawCommand]], list[Any]]
AsyncSend = Callable[[list[RawCommand]], Awaitable[list[Any]]]


def barrier(keys: Keys, *, cluster: bool) -> RawCommand:
    """The barrier of ``keys``'s namespace: ``write_barrier`` on Redis Cluster, else
    ``publish_barrier``."""
    return write_barrier(keys.wait_barrier_key) if cluster else publish_barrier(keys.wait_barrier)


def publish_barrier(channel: str) -> RawCommand:
    """The barrier on one server: ``PUBLISH`` on a channel nobody subscribes to."""
    return ("PUBLISH", channel, b"")


def write_barrier(key: str) -> RawCommand:
    """The barrier on Redis Cluster, where ``PUBLISH`` is not replicated: ``SET`` of a key in
    the namespace's slot (the same value each time; ``SET`` is propagated all the same)."""
    return ("SET", key, b"")


@dataclass(frozen=True)
class WaitForReplicas:
    """Follow every write with ``barrier`` and ``WAIT replicas timeout`` on its connection
    (module docstring)."""

    replicas: int
    timeout: float
    barrier: RawCommand

    @property
    def timeout_ms(self) -> int:
        return max(1, round(self.timeout * 1000))

    def evalsha(self, client: redis.Redis, script: Script, keys: list[Any], args: list[Any]) -> Any:
        """The script's reply, once ``replicas`` replicas hold what it rests on. A server
        that lost its script cache (a restart, a promoted replica) gets it loaded again."""
        return self.evalsha_via(pipeline_send(client), lambda: client.script_load(script.script),
                                script, keys, args)  # fmt: skip

    def evalsha_via(
        self, send: Send, load: Callable[[], str], script: Script | AsyncScript,
        keys: list[Any], args: list[Any],
    ) -> Any:  # fmt: skip
        """``evalsha`` through ``send``; ``load()`` loads the script where ``send`` sends."""
        reply = self._judge(send(self._commands(_evalsha(script, keys, args))))
        if isinstance(reply, redis.exceptions.NoScriptError):
            script.sha = load()
            reply = self._judge(send(self._commands(_evalsha(script, keys, args))))
        return _raised(reply)

    def command(self, client: redis.Redis, method: str, args: tuple[Any, ...]) -> Any:
        """A plain writing command (``WRITING_READS``: its redis-py method is its name), then
        the barrier and ``WAIT``."""
        commands = self._commands((method.upper(), *args))
        return _raised(self._judge(pipeline_send(client)(commands)))

    async def evalsha_async(
        self, client: redis.asyncio.Redis, script: AsyncScript, keys: list[Any], args: list[Any]
    ) -> Any:
        """``evalsha`` on ``redis.asyncio`` (``AsyncRedisTaskStore``)."""

        async def send(commands: list[RawCommand]) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return await pipe.execute(raise_on_error=False)

        async def load() -> str:
            return await client.script_load(script.script)

        return await self.evalsha_via_async(send, load, script, keys, args)

    async def evalsha_via_async(
        self, send: AsyncSend, load: Callable[[], Awaitable[str]], script: AsyncScript,
        keys: list[Any], args: list[Any],
    ) -> Any:  # fmt: skip
        """``evalsha_via`` for coroutines."""
        reply = self._judge(await send(self._commands(_evalsha(script, keys, args))))
        if isinstance(reply, redis.exceptions.NoScriptError):
            script.sha = await load()
            reply = self._judge(await send(self._commands(_evalsha(script, keys, args))))
        return _raised(reply)

    def _commands(self, write: RawCommand) -> list[RawCommand]:
        """One round trip: the write, the barrier, ``WAIT``."""
        return [write, self.barrier, ("WAIT", self.replicas, self.timeout_ms)]

    def _judge(self, replies: list[Any]) -> Any:
        """The write's reply (an exception object if the server refused it, for the caller to
        raise) when the replicas confirmed; ``StoreUnavailable`` when they did not."""
        reply, barrier, acknowledged = replies
        if isinstance(reply, NOT_RUN_HERE):
            raise reply  # nothing ran here: the WAIT after it counted nothing
        if isinstance(reply, redis.exceptions.NoScriptError):
            return reply  # nothing ran: the caller loads the script and sends it again
        _raised(barrier)  # refused (ASK: its key moved first), it proves nothing: sent again
        if _unblocked(acknowledged):
            raise PrimaryDemoted(f"the server stopped being a primary while the write waited "
                                 f"for its replicas ({acknowledged}): its outcome is unknown; "
                                 "retrying is safe")  # fmt: skip
        acknowledged = _raised(acknowledged)
        if int(acknowledged) < self.replicas:
            raise StoreUnavailable(
                f"only {acknowledged} of {self.replicas} replica(s) confirmed the write within "
                f"{self.timeout:g} s (durability_replicas={self.replicas}): it may be on the "
                "primary alone, so its outcome is unknown; retrying is safe"
            )
        return reply


def pipeline_send(client: redis.Redis) -> Send:
    """``Send`` as a non-transactional pipeline of ``client``."""

    def send(commands: list[RawCommand]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return pipe.execute(raise_on_error=False)

    return send


def _unblocked(reply: Any) -> bool:
    """``WAIT`` refused with ``UNBLOCKED``: the server was made a replica while it waited."""
    return isinstance(reply, redis.exceptions.ResponseError) and str(reply).startswith("UNBLOCKED")


def _evalsha(script: Script | AsyncScript, keys: list[Any], args: list[Any]) -> RawCommand:
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def write_or_read(
    rule: WaitForReplicas | None, method: str, args: tuple[Any, ...], client: redis.Redis
) -> Any:
    """A plain command (``_redis.ops.Read``) of the redis-py method ``method``, followed by
    the barrier and ``WAIT`` under ``rule`` if it writes (``WRITING_READS``)."""
    if rule is not None and method in WRITING_READS:
        return rule.command(client, method, args)
    return getattr(client, method)(*args)


def _raised(value: Any) -> Any:
    if isinstance(value, Exception):
        raise value
    return value


def wait_rule(
    replicas: object, timeout: object, socket_timeout: float | None, barrier: RawCommand
) -> WaitForReplicas | None:
    """The rule ``durability_replicas=replicas`` asks for (``None`` for 0: no ``WAIT``), with
    ``barrier`` (``publish_barrier``, or ``write_barrier`` on Redis Cluster), its arguments
    checked: ``ValueError``/``TypeError`` for a negative or non-integer count, or a
    timeout that is not a positive number below the socket timeout (a ``WAIT`` that outlasts
    the socket's read timeout would be cut off and the whole call re-sent)."""
    if type(replicas) is not int:
        raise TypeError(f"durability_replicas must be an int, not {type(replicas).__name__}")
    if replicas < 0:
        raise ValueError(f"durability_replicas must be 0 or more, not {replicas}")
    if timeout is None:
        timeout = socket_timeout / 2 if socket_timeout else DEFAULT_WAIT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"durability_timeout must be a number, not {type(timeout).__name__}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"durability_timeout must be a positive number of seconds, not {timeout}")
    if socket_timeout and timeout >= socket_timeout:
        raise ValueError(f"durability_timeout ({timeout:g} s) must be below the socket "
                         f"timeout ({socket_timeout:g} s): WAIT blocks that long for its "
                         "reply")  # fmt: skip
    if replicas == 0:
        return None
    return WaitForReplicas(replicas, float(timeout), barrier)


def check_replicas(client: redis.Redis, rule: WaitForReplicas) -> str | None:
    """Warn (log) when the server cannot satisfy the rule now: it is not a primary, or fewer
    than ``rule.replicas`` replicas are connected (every write then fails with
    ``StoreUnavailable`` until enough are). On Redis Cluster ``client`` is the namespace's slot
    master. Returns the warning; an ACL that forbids INFO skips the check."""
    try:
        info = client.info("replication")
    except (redis.exceptions.NoPermissionError, redis.exceptions.ResponseError) as exc:
        log.info("replicas not checked: %s", exc)
        return None
    role, connected = info.get("role"), int(info.get("connected_slaves", 0))
    if role != "master":
        problem = f"the server is a {role}, not a primary: writes will be refused"
    elif connected < rule.replicas:
        problem = (f"durability_replicas={rule.replicas} but the server has {connected} "
                   "connected replica(s): every write fails with StoreUnavailable until "
                   "enough replicas are connected")  # fmt: skip
    else:
        return None
    log.warning("chongming-redis: %s", problem)
    return problem
