"""``durability_replicas``: a write is acknowledged only once ``N`` replicas have it.

Redis replicates asynchronously: a write the primary acknowledged can be lost when a replica
that never received it is promoted (a forced failover). With ``RedisTaskStore(...,
durability_replicas=N)`` every write call is sent as one non-transactional pipeline on one
connection::

    EVALSHA <script> ...        the write itself
    PUBLISH {ns}:nudge:!wait    a barrier (below)
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
ACL that allows the nudges allows it.

What it does not promise (Redis's own words: ``WAIT`` is best effort): a replica that
acknowledged can still be passed over by a failover that promotes another one, and a
replica's copy is in its memory, not necessarily on its disk. Reads are not followed by
``WAIT``: a read can see a write of another client that is not replicated yet.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from redis.commands.core import AsyncScript, Script

from chongming_redis.errors import StoreUnavailable

log = logging.getLogger("chongming_redis.store")

#: The ``WAIT`` timeout when none is given and the client has no socket timeout (seconds).
DEFAULT_WAIT_TIMEOUT = 2.5

#: Plain commands (``_redis_ops.Read``) that write: they are followed by ``WAIT`` too.
WRITING_READS = frozenset({"sadd"})


@dataclass(frozen=True)
class WaitForReplicas:
    """Follow every write with ``WAIT replicas timeout`` on its connection (module docstring);
    ``channel`` is the barrier's."""

    replicas: int
    timeout: float
    channel: str

    @property
    def timeout_ms(self) -> int:
        return max(1, round(self.timeout * 1000))

    def evalsha(self, client: redis.Redis, script: Script, keys: list[Any], args: list[Any]) -> Any:
        """The script's reply, once ``replicas`` replicas hold what it rests on. A server
        that lost its script cache (a restart, a promoted replica) gets it loaded again."""

        def send(pipe: Any) -> None:
            pipe.evalsha(script.sha, len(keys), *keys, *args)

        reply = self._pipeline(client, send)
        if isinstance(reply, redis.exceptions.NoScriptError):
            script.sha = client.script_load(script.script)
            reply = self._pipeline(client, send)
        return _raised(reply)

    def command(self, client: redis.Redis, method: str, args: tuple[Any, ...]) -> Any:
        """A plain writing command (``WRITING_READS``), then the barrier and ``WAIT``."""
        return _raised(self._pipeline(client, lambda p: getattr(p, method)(*args)))

    async def evalsha_async(
        self, client: redis.asyncio.Redis, script: AsyncScript, keys: list[Any], args: list[Any]
    ) -> Any:
        """``evalsha`` on ``redis.asyncio`` (``AsyncRedisStore``)."""

        async def send() -> Any:
            pipe = client.pipeline(transaction=False)
            self._queue(pipe, lambda p: p.evalsha(script.sha, len(keys), *keys, *args))
            return self._judge(await pipe.execute(raise_on_error=False))

        reply = await send()
        if isinstance(reply, redis.exceptions.NoScriptError):
            script.sha = await client.script_load(script.script)
            reply = await send()
        return _raised(reply)

    def _pipeline(self, client: redis.Redis, write: Callable[[Any], object]) -> Any:
        """One round trip: the write, the barrier, ``WAIT``; its reply as ``_judge`` says."""
        pipe = client.pipeline(transaction=False)
        self._queue(pipe, write)
        return self._judge(pipe.execute(raise_on_error=False))

    def _queue(self, pipe: Any, write: Callable[[Any], object]) -> None:
        write(pipe)
        pipe.publish(self.channel, b"")
        pipe.wait(self.replicas, self.timeout_ms)

    def _judge(self, replies: list[Any]) -> Any:
        """The write's reply (an exception object if the server refused it, for the caller to
        raise) when the replicas confirmed; ``StoreUnavailable`` when they did not."""
        reply, published, acknowledged = replies
        if isinstance(reply, redis.exceptions.NoScriptError):
            return reply  # nothing ran: the caller loads the script and sends it again
        _raised(published)
        acknowledged = _raised(acknowledged)
        if int(acknowledged) < self.replicas:
            raise StoreUnavailable(
                f"only {acknowledged} of {self.replicas} replica(s) confirmed the write within "
                f"{self.timeout:g} s (durability_replicas={self.replicas}): it may be on the "
                "primary alone, so its outcome is unknown; retrying is safe"
            )
        return reply


def write_or_read(
    rule: WaitForReplicas | None, method: str, args: tuple[Any, ...], client: redis.Redis
) -> Any:
    """A plain command (``_redis_ops.Read``) of the redis-py method ``method``, followed by
    the barrier and ``WAIT`` under ``rule`` if it writes (``WRITING_READS``)."""
    if rule is not None and method in WRITING_READS:
        return rule.command(client, method, args)
    return getattr(client, method)(*args)


def _raised(value: Any) -> Any:
    if isinstance(value, Exception):
        raise value
    return value


def wait_rule(
    replicas: object, timeout: object, socket_timeout: float | None, channel: str
) -> WaitForReplicas | None:
    """The rule ``durability_replicas=replicas`` asks for (``None`` for 0: no ``WAIT``), its
    arguments checked: ``ValueError``/``TypeError`` for a negative or non-integer count, or a
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
    return WaitForReplicas(replicas, float(timeout), channel)


def check_replicas(client: redis.Redis, rule: WaitForReplicas) -> str | None:
    """Warn (log) when the server cannot satisfy the rule now: it is not a primary, or fewer
    than ``rule.replicas`` replicas are connected (every write then fails with
    ``StoreUnavailable`` until enough are). Returns the warning; an ACL that forbids INFO
    skips the check."""
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
