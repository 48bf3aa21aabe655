"""Driving a plan, without I/O: what ``RedisTaskStore`` (redis-py) and ``AsyncRedisTaskStore``
(``redis.asyncio``) share, written once.

A plan (``_redis.ops``) yields requests; the store sends each through its own I/O and sends
the reply back. Everything that is not I/O is here:

* ``Run`` steps a plan: the store is checked to be open before every request, and once at the
  end of a plan that made none, so an argument error (raised at the plan's first step) comes
  before ``StoreClosed``.
* ``Driver``, the base of both stores: their state (the keys, the durability rule, the cluster
  calls, whether the server predates script flags, closed or not), the closed check, and which
  of the store's I/O methods sends a script call (``_sender``: on Redis Cluster, read-only,
  under ``durability_replicas``, or plain).
* ``evalsha`` and ``transaction``, the calls that are the same on both clients (their reply,
  or an awaitable of it); ``coded`` (a reply's code as text); ``check_before_connecting``
  (``from_url``'s checks).

A store adds the I/O alone, in methods of the same names and signatures in both (``await``-ed
in the async one): ``_perform`` (the loop over ``Run``), ``_request`` (a ``Script`` to ``_run``,
anything else to ``_read``), ``_run`` (one script call, its reply checked by
``_redis.replies.check``), ``_eval`` (the call as ``_sender`` sends it), ``_read`` (a plain
command or a transaction), ``_script`` (the registered script), ``_evalsha_ro`` and
``_evalsha_waiting``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from chongming_redis.errors import StoreClosed
from chongming_redis.stores._redis import durability
from chongming_redis.stores._redis.cluster import ClusterCalls
from chongming_redis.stores._redis.cluster_async import AsyncClusterCalls
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores._redis.ops import Plan, Request, Transaction
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores._redis.scripts import READ_ONLY_SCRIPTS

T = TypeVar("T")
#: The cluster calls of the store's client: ``redis.cluster``'s or ``redis.asyncio``'s.
ClusterT = TypeVar("ClusterT", ClusterCalls, AsyncClusterCalls)
#: Sends one script call (script, keys, args): its reply, or an awaitable of it.
Sender = Callable[[Any, list[Any], list[Any]], Any]


class Run(Generic[T]):
    """One plan, stepped by a store: ``start()``, then ``send(reply)`` for each request it
    returns, until one returns ``None``; the plan's answer is then ``result``."""

    result: T

    def __init__(self, plan: Plan[T], check_open: Callable[[], None]) -> None:
        self._plan = plan
        self._check_open = check_open
        self._requested = False

    def start(self) -> Request | None:
        return self.send(None)

    def send(self, reply: Any) -> Request | None:
        """The plan's next request, once it was sent ``reply`` (the last request's)."""
        try:
            request = self._plan.send(reply)
        except StopIteration as done:
            if not self._requested:
                self._check_open()
            self.result = done.value
            return None
        self._requested = True
        self._check_open()
        return request


class Driver(Generic[ClusterT]):
    """The state and the decisions of a Redis store that are not I/O (module docstring).
    ``cluster_calls`` makes the store's cluster calls of its client (``None``: one server)."""

    #: Whether the server predates script flags (then no ``EVALSHA_RO``); ``None``: not asked
    #: yet (``AsyncRedisTaskStore`` asks at its first script call).
    legacy_scripts: bool | None

    def __init__(
        self,
        client: Any,
        cluster_calls: Callable[[object, str], ClusterT | None],
        *,
        namespace: str,
        owns_client: bool,
        durability_replicas: int,
        durability_timeout: float | None,
    ) -> None:
        self.keys = Keys(namespace)
        #: On Redis Cluster: the calls routed to the namespace's slot (``_redis.cluster``).
        self._cluster: ClusterT | None = cluster_calls(client, self.keys.root)
        #: ``durability_replicas``: writes wait for replicas (``_redis.durability``).
        self.wait_rule = durability.wait_rule(
            durability_replicas, durability_timeout,
            client.get_connection_kwargs().get("socket_timeout"),
            durability.barrier(self.keys, cluster=self._cluster is not None),
        )  # fmt: skip
        self._owns_client = owns_client
        self._closed = False
        self.legacy_scripts = None

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed()

    if TYPE_CHECKING:  # the store's I/O (coroutine functions on AsyncRedisTaskStore)

        def _evalsha_ro(self, script: Any, keys: list[Any], args: list[Any]) -> Any: ...
        def _evalsha_waiting(
            self, rule: durability.WaitForReplicas, script: Any, keys: list[Any], args: list[Any]
        ) -> Any: ...

    def _sender(self, name: str) -> Sender:
        """The I/O that sends a call of the script ``name`` (after ``_script``: the async
        store learns ``legacy_scripts`` there)."""
        writes = name not in READ_ONLY_SCRIPTS
        if self._cluster is not None:  # EVALSHA even if read-only (``_redis.cluster``)
            return partial(self._cluster.eval, rule=self.wait_rule if writes else None)
        if not writes and not self.legacy_scripts:
            return self._evalsha_ro
        if writes and self.wait_rule is not None:
            return partial(self._evalsha_waiting, self.wait_rule)
        return evalsha


def evalsha(script: Any, keys: list[Any], args: list[Any]) -> Any:
    """The script object's own call (redis-py's ``Script``/``AsyncScript``): ``EVALSHA``, and
    after ``NOSCRIPT`` the script loaded and sent again."""
    return script(keys=keys, args=args)


def coded(reply: list[Any]) -> list[Any]:
    """A script's reply, its code (the first element) made ``str``."""
    reply[0] = text(reply[0])
    return reply


def transaction(client: Any, request: Transaction) -> Any:
    """The transaction's commands sent in one ``MULTI``/``EXEC`` pipeline of ``client``: their
    replies (an awaitable of them on ``redis.asyncio``), a refused command's as its exception,
    in its place. A new pipeline each call: a retry must not send one that already ran."""
    queued = client.pipeline(transaction=True)
    for read in request.reads:
        getattr(queued, read.method)(*read.args)
    return queued.execute(raise_on_error=False)


def check_before_connecting(
    namespace: str, replicas: int, timeout: float | None, socket_timeout: float
) -> None:
    """``from_url`` refuses a bad namespace, and bad durability options, before it makes a
    client."""
    Keys(namespace)
    durability.wait_rule(replicas, timeout, socket_timeout, ())
