"""``RedisTaskStore`` on Redis Cluster: what differs from one server, in one place.

A namespace lives in one slot (every key starts with its hash tag ``{ns}:``, ``_redis/keys.py``), so
every script and every read goes to the one master that holds the slot; redis-py's
``RedisCluster`` routes them by key and follows ``MOVED`` (a slot that moved) and ``ASK`` (a
key already migrated). What this module adds:

* **Scripts on the slot's master.** ``EVALSHA`` by the namespace's key; a master that does not
  know a script yet (a new master after a failover, another after a reshard: ``NOSCRIPT``) gets
  it loaded (``SCRIPT LOAD`` on that node only, so one master down elsewhere does not fail the
  call) and the call is sent again. Read-only scripts go through plain ``EVALSHA`` here
  (``EVALSHA_RO`` would cost redis-py a ``COMMAND GETKEYS`` round trip to route it).
* **A slot migration pauses the namespace; it never splits a script.** While the slot
  migrates, Redis refuses a script whose declared keys are not all on one node with
  ``TRYAGAIN``. Every script that derives keys from the namespace root declares the root (a
  key that never exists) and at least one other key, so no such script runs on either node
  until the last key has moved (``docs/redis-layout.md``). redis-py retries ``TRYAGAIN`` only
  briefly (16 redirections, then "TTL exhausted"); ``during_migration`` keeps retrying, with a
  backoff, for up to ``MIGRATION_WAIT`` seconds, then the call is ``StoreUnavailable`` (a
  refused script never ran, so a retry is safe).
* **Server questions asked of the right nodes.** ``TIME`` of the slot's master (the clock of
  the node that runs the scripts), ``HELLO`` of the same, and the durability settings (``INFO``)
  of every node: a replica's settings matter the moment it is promoted.
* **``durability_replicas`` on the slot's master.** ``WAIT`` counts the replicas of the
  connection it is sent on, which redis-py's cluster client does not let a caller choose: each
  write is sent, as on one server (``_redis.durability``), as one pipeline on a connection to
  the slot's master (the plain ``redis.Redis`` the cluster client keeps for that node), its
  barrier a ``SET`` of ``Keys.wait_barrier_key`` (``PUBLISH`` is not replicated in a cluster).
  A reply that says nothing ran there (``MOVED``: the slot map is refreshed from it; ``ASK``,
  ``TRYAGAIN``: the slot is migrating) is never taken for a success: the call is sent again
  within ``MIGRATION_WAIT``. A lost connection or ``CLUSTERDOWN`` refreshes the slot map and
  sends it again up to the client's retries (the node's own connections never retry).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.retry import Retry

from chongming_redis.errors import StoreError, StoreUnavailable
from chongming_redis.stores._redis.connect import client_from_url
from chongming_redis.stores._redis.durability import WRITING_READS, WaitForReplicas
from chongming_redis.stores._redis.packer import SignalSafeConnection
from chongming_redis.stores._redis.server import check_server_settings, supports_script_flags

T = TypeVar("T")

#: How long a call waits for its namespace's slot to finish migrating (``TRYAGAIN``).
MIGRATION_WAIT = 60.0
#: What a call that met a moving slot raises (``is_migrating`` tells which of them do).
MIGRATION_ERRORS = (
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterError,
    redis.exceptions.AskError,
)
#: Errors after which a call on the slot's master refreshes the slot map and is sent again
#: (the client's retries): the node is down or failing over, or the map is stale.
REFRESH_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
)
#: A refresh of the slot map that fails (no node answers): left to the next attempt.
UNREFRESHED = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
#: A script call loads the script on the node that answered ``NOSCRIPT`` at most this often
#: (a failover during the call can move it to a node that needs it too).
SCRIPT_LOADS = 3


def connect_cluster(
    url: str,
    *,
    socket_timeout: float,
    socket_connect_timeout: float,
    retries: int,
    **options: Any,
) -> RedisCluster:
    """A ``RedisCluster`` from ``url`` (one node's ``redis://`` or ``rediss://`` URL; the client
    discovers the others), with the single-node store's timeouts and retries (redis-py's
    cluster client retries a failed connection ``retries`` times, refreshing the slot map
    first). It connects at once: an unreachable cluster is ``StoreUnavailable``, a server
    that is not a cluster node ``StoreError``, a bad URL ``ValueError``."""
    if urlsplit(url).scheme == "redis":  # for rediss:// redis-py sets its own TLS class
        options.setdefault("connection_class", SignalSafeConnection)
    try:
        return client_from_url(RedisCluster.from_url, url, Retry, socket_timeout=socket_timeout,
                               socket_connect_timeout=socket_connect_timeout, retries=retries,
                               **options)  # fmt: skip
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise StoreUnavailable(f"Redis Cluster is unreachable: {exc}") from exc
    except redis.exceptions.RedisClusterException as exc:
        raise cluster_error(url, exc) from exc
    except redis.exceptions.RedisError as exc:
        raise StoreError(f"Redis Cluster error: {exc}") from exc


def _address(url: str) -> str:
    """``host:port`` of ``url`` for messages (never its password), else its scheme."""
    try:
        parts = urlsplit(url)
        return f"{parts.hostname}:{parts.port or 6379}" if parts.hostname else url.split(":")[0]
    except ValueError:
        return url.split(":")[0]


def cluster_error(url: str, exc: Exception) -> Exception:
    """redis-py's ``RedisClusterException`` at connection as the store's error."""
    message, shown = str(exc), _address(url)
    if "not enabled" in message:  # "Cluster mode is not enabled on this node"
        return StoreError(f"{shown} is not a Redis Cluster node (cluster mode is not enabled)")
    if "cannot be connected" in message:
        return StoreUnavailable(f"Redis Cluster is unreachable: {message.split('node: ')[-1]}")
    if "Unix" in message or "db" in message:
        return ValueError(f"bad Redis URL for a cluster ({shown}): {message}")
    return StoreError(f"Redis Cluster at {shown}: {message}")


class ClusterCalls:
    """The calls of one namespace's store that a cluster routes differently (see the
    module's docstring). ``key`` is any key of the namespace: it names the slot."""

    def __init__(self, client: RedisCluster, key: str) -> None:
        self.client: Any = client  # redis-py's cluster methods are untyped
        self.key = key

    @classmethod
    def of(cls, client: object, key: str) -> ClusterCalls | None:
        """The cluster calls of ``client`` if it is a ``RedisCluster``, else ``None``."""
        return cls(client, key) if isinstance(client, RedisCluster) else None

    def node(self) -> Any:
        """The master that holds the namespace's slot, as the client knows it now."""
        return self.client.get_node_from_key(self.key)

    def eval(
        self, script: Script, keys: Sequence[str], args: Sequence[Any],
        rule: WaitForReplicas | None = None,
    ) -> Any:  # fmt: skip
        """``EVALSHA`` routed by ``keys``; ``NOSCRIPT`` loads it there and sends it again.
        With ``rule`` (a write under ``durability_replicas``): with its barrier and ``WAIT``,
        on the slot's master."""
        if rule is not None:
            call = lambda c: rule.evalsha(c, script, list(keys), list(args))  # noqa: E731
            return during_migration(lambda: self.on_master(call))
        return during_migration(lambda: self._evalsha(script, keys, args))

    def read(self, rule: WaitForReplicas | None, method: str, args: tuple[Any, ...]) -> Any:
        """A plain command of the namespace (``_redis.ops.Read``): ``TIME`` of the slot's
        master; under ``rule`` a writing one (``WRITING_READS``) with its barrier and ``WAIT``
        on the master; any other routed by its key."""
        if method == "time":
            return self.time()
        if rule is not None and method in WRITING_READS:
            return self.on_master(lambda c: rule.command(c, method, args))
        return getattr(self.client, method)(*args)

    def master(self) -> redis.Redis:
        """The cluster client's plain client of the slot's master (one connection pool)."""
        return self.client.get_redis_connection(self.node())  # type: ignore[no-any-return]

    def on_master(self, call: Callable[[redis.Redis], T]) -> T:
        """``call(master)``; a ``MOVED`` reply updates the slot map and is raised (for
        ``during_migration`` to send it again); after a lost connection or ``CLUSTERDOWN``
        the slot map is refreshed and the call sent again, up to the client's retries."""
        retries = self.client.retry.get_retries()
        attempt = 0
        while True:
            try:
                return call(self.master())
            except redis.exceptions.MovedError as moved:
                self.client.nodes_manager.move_slot(moved)
                raise
            except REFRESH_ERRORS:
                if attempt >= retries:
                    raise
            time.sleep(min(0.05 * 2**attempt, 1.0))
            attempt += 1
            with contextlib.suppress(*UNREFRESHED):  # the next attempt says what is wrong
                self.client.nodes_manager.initialize()

    def _evalsha(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        loads = 0
        while True:
            try:
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                loads += 1
                if loads > SCRIPT_LOADS:
                    raise
                # The slot's master first; if the script is still missing where the call
                # went (the slot moved meanwhile), every master.
                nodes = [self.node()] if loads == 1 else self.client.get_primaries()
                self._load(script, nodes)

    def _load(self, script: Script, nodes: Sequence[Any]) -> None:
        for node in nodes:
            try:
                self.client.execute_command("SCRIPT LOAD", script.script, target_nodes=node)
            except redis.exceptions.ConnectionError:
                continue  # a master that is down runs nothing: it needs no script

    def call(self, call: Callable[[], T]) -> T:
        """A plain command (or transaction) of the namespace, retried while its slot
        migrates."""
        return during_migration(call)

    def time(self) -> Any:
        """``TIME`` of the slot's master: the clock of the node that runs the scripts."""
        return self.client.execute_command("TIME", target_nodes=self.node())

    def supports_script_flags(self) -> bool:
        """``HELLO`` of the slot's master (Redis >= 7: script flags and ``EVALSHA_RO``)."""
        return supports_script_flags(self.client.get_redis_connection(self.node()))

    def check_server_settings(self) -> list[str]:
        """Every node's durability settings (``_redis.server.check_server_settings``), the
        replicas' too (a replica's settings matter the moment it is promoted): each node
        warned about once, each problem returned once. A node that cannot be asked (down,
        failing) is left out: the cluster itself reports it."""
        problems: list[str] = []
        for host, port in self.node_addresses():
            node = self.client.nodes_manager.create_redis_node(
                host, port, **self.client.nodes_manager.connection_kwargs
            )
            try:
                for problem in check_server_settings(node):
                    if problem not in problems:
                        problems.append(problem)
            except redis.exceptions.ConnectionError:
                continue
            finally:
                node.close()
        return problems

    def node_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node that ``CLUSTER NODES`` lists as reachable, masters
        and replicas (redis-py's client knows only the masters)."""
        listed = self.client.cluster_nodes()
        addresses = []
        for address, fields in listed.items():
            flags = set(str(fields.get("flags", "")).split(","))
            if flags & {"fail", "noaddr", "handshake"}:
                continue
            host, _, port = address.split("@")[0].rpartition(":")
            addresses.append((host, int(port)))
        return sorted(addresses)


def during_migration(call: Callable[[], T], wait: float | None = None) -> T:
    """``call()``, again while Redis answers that the slot is migrating: ``TRYAGAIN``,
    redis-py's "TTL exhausted" after redirections between the two nodes (``ASK``, then
    ``TRYAGAIN``), or ``ASK``/``MOVED`` to a call on the slot's master (``on_master``). Waits
    at most ``wait`` (default ``MIGRATION_WAIT``) seconds in all; the last refusal is raised
    (``_redis.ops.errors`` makes it ``StoreUnavailable``)."""
    deadline = time.monotonic() + (MIGRATION_WAIT if wait is None else wait)
    delay = 0.005
    while True:
        try:
            return call()
        except MIGRATION_ERRORS as exc:
            if not is_migrating(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def is_migrating(exc: BaseException) -> bool:
    """Whether ``exc`` says the slot is moving or has moved (a retry is safe): ``TRYAGAIN``,
    redis-py's "TTL exhausted", or ``ASK``/``MOVED`` answered to a call sent to the slot's
    master itself (``ClusterCalls.on_master``: redis-py does not follow those)."""
    if isinstance(exc, redis.exceptions.TryAgainError | redis.exceptions.AskError):
        return True
    return isinstance(exc, redis.exceptions.ClusterError) and "TTL exhausted" in str(exc)
