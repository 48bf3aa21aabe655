"""A loopback TCP proxy in front of a redis-server that injects network faults on schedule.

Used by the stress harness (between its worker processes and Redis) and by the tests
(Toxiproxy's toxics as the reference). The proxy runs an asyncio event loop in its own daemon
thread and listens on ``127.0.0.1:<free port>``; every accepted client connection gets its own
upstream connection to Redis (loopback only, unless ``allow_remote``: the stress harness run
against a user's ``--redis``).

It parses both directions of RESP so it knows which reply belongs to which request:

* client -> Redis: arrays of bulk strings (``*N\\r\\n$len\\r\\n...``) and inline commands,
  pipelined or split across TCP reads; every complete request is counted by its (upper-cased)
  first element in :attr:`FaultProxy.commands_seen` and appended to the connection's FIFO of
  pending requests.
* Redis -> client: complete RESP2/RESP3 replies (push frames ``>`` do not consume a pending
  request; attributes ``|`` belong to the reply that follows). Each reply pops one pending
  request, which is how :meth:`FaultProxy.drop_reply_of` knows when the doomed request's reply
  has fully arrived. After SUBSCRIBE/MONITOR-style commands (or unparsable data) a connection
  is forwarded raw and no longer tracked.

Toxics are scheduled and count their firings (:attr:`FaultProxy.fired`), so a test can assert
that the fault really happened (the Temporal lesson):

* ``drop_reply_of(command, nth)`` - the ambiguity fault of fact 2: the request reaches Redis
  and runs, its reply is swallowed and both sides of that connection are reset (RST).
* ``reset_all()`` - RST every open connection now.
* ``set_latency(seconds)`` - delay Redis -> client data.
* ``blackhole(on)`` - accept and read, forward nothing (the client times out).
* ``refuse(on)`` - new connections are reset as soon as they are accepted.

``raw=True`` proxies another protocol (PostgreSQL's, for the stress run on a PostgreSQL store):
nothing is parsed, every connection is forwarded as bytes from the start, so ``drop_reply_of``
never fires; latency, resets, blackhole and refuse work as they do on RESP.

Typical use::

    with FaultProxy("127.0.0.1", redis_proc.port) as proxy:
        client = redis.Redis(port=proxy.port, retry=None)
        toxic = proxy.drop_reply_of("EVALSHA", nth=3)
        ...
        assert toxic.fired == 1
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from chongming_redis.stress.proxy_conn import (
    BLACKHOLE,
    DROP_REPLY,
    LATENCY,
    REFUSE,
    RESET_ALL,
    DropReply,
    _Conn,
)
from chongming_redis.stress.proxy_resp import RespError, parse_request, reply_end

# Re-exported: callers and tests import these from here, where the proxy is documented.
__all__ = [
    "BLACKHOLE",
    "DROP_REPLY",
    "LATENCY",
    "LOOPBACK",
    "REFUSE",
    "RESET_ALL",
    "DropReply",
    "FaultProxy",
    "RespError",
    "parse_request",
    "reply_end",
]

LOOPBACK = "127.0.0.1"
T = TypeVar("T")
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


class FaultProxy:
    """Loopback TCP proxy with scheduled, counted faults. See the module docstring.

    Thread-safe: toxics are armed from the test thread, traffic runs on the proxy's own loop.
    """

    def __init__(
        self,
        upstream_host: str = LOOPBACK,
        upstream_port: int = 6379,
        *,
        connect_timeout: float = 5.0,
        allow_remote: bool = False,
        raw: bool = False,
    ) -> None:
        if upstream_host in _LOOPBACK_NAMES:
            upstream_host = LOOPBACK
        elif not allow_remote:
            raise ValueError(f"FaultProxy only proxies to loopback, not {upstream_host!r}")
        self.upstream_host = upstream_host
        self.upstream_port = int(upstream_port)
        self.connect_timeout = connect_timeout
        self.raw = raw  # forward bytes, parse no RESP
        self._lock = threading.Lock()
        self._commands_seen: Counter[str] = Counter()
        self._fired: Counter[str] = Counter()
        self._drops: list[DropReply] = []
        self._latency = 0.0
        self._blackholing = False
        self._refusing = False
        self._accepted = 0
        self._upstream_failures = 0
        self._conns: set[_Conn] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run_loop, name=f"FaultProxy->{self.upstream_port}", daemon=True
        )
        self._thread.start()
        try:
            self.port: int = self._call(self._start(), timeout=5.0)
        except BaseException:
            self._stop_loop()
            raise

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening, reset every connection, stop the loop and join its thread."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._call(self._shutdown(), timeout=timeout)
        self._stop_loop(timeout)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def _stop_loop(self, timeout: float = 5.0) -> None:
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._handle, LOOPBACK, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.reset()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = _Conn(self, creader, cwriter)
        self._handlers.add(task)
        self._conns.add(conn)
        with self._lock:
            self._accepted += 1
        try:
            await conn.run()
        finally:
            conn.reset()
            self._conns.discard(conn)
            self._handlers.discard(task)

    # ----------------------------------------------------------------- bookkeeping

    def _on_request(self, name: bytes) -> DropReply | None:
        """Count one complete request; return the drop toxic it triggers, if any."""
        text = name.decode("ascii", "replace")
        doomed: DropReply | None = None
        with self._lock:
            self._commands_seen[text] += 1
            for toxic in self._drops:
                if toxic.command == name and toxic.armed:
                    toxic.seen += 1
                    if toxic.seen == toxic.nth and doomed is None:
                        doomed = toxic
            self._drops = [t for t in self._drops if t.armed]
        return doomed

    def _fire(self, name: str, toxic: DropReply | None = None) -> None:
        with self._lock:
            self._fired[name] += 1
            if toxic is not None:
                toxic.fired += 1
        if toxic is not None:
            toxic.fired_event.set()

    @property
    def commands_seen(self) -> Counter[str]:
        """Complete requests forwarded to Redis, by upper-cased command name (a copy)."""
        with self._lock:
            return Counter(self._commands_seen)

    @property
    def fired(self) -> dict[str, int]:
        """Firings per toxic name (``drop_reply_of``, ``reset_all``, ``latency`` = delayed
        chunks, ``blackhole`` = connections swallowed, ``refuse`` = connections refused)."""
        with self._lock:
            return dict(self._fired)

    @property
    def accepted(self) -> int:
        """Client connections accepted so far."""
        with self._lock:
            return self._accepted

    @property
    def open_connections(self) -> int:
        return self._call(self._count_conns(), timeout=5.0)

    async def _count_conns(self) -> int:
        return len(self._conns)

    def wait_fired(self, name: str, count: int = 1, timeout: float = 5.0) -> bool:
        """Wait until toxic ``name`` fired at least ``count`` times."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.fired.get(name, 0) >= count:
                return True
            time.sleep(0.005)
        return self.fired.get(name, 0) >= count

    # ----------------------------------------------------------------- toxics

    def drop_reply_of(self, command: str, nth: int = 1) -> DropReply:
        """Arm: the ``nth`` (1-based, across all connections, from now) ``command`` request is
        forwarded and runs in Redis, but its reply is swallowed and that connection is reset
        (RST both sides) once the reply has fully arrived. Fires once."""
        if nth < 1:
            raise ValueError("nth is 1-based")
        toxic = DropReply(command=command.upper().encode(), nth=nth)
        with self._lock:
            self._drops.append(toxic)
        return toxic

    def clear(self) -> None:
        """Disarm pending drop toxics and switch latency, blackhole and refuse off."""
        with self._lock:
            self._drops.clear()
        self._latency = 0.0
        self._blackholing = False
        self._refusing = False

    def reset_all(self) -> int:
        """RST every open client connection (and its upstream) now; returns how many.
        Counts one ``reset_all`` firing per call."""
        count = self._call(self._reset_all(), timeout=5.0)
        self._fire(RESET_ALL)
        return count

    async def _reset_all(self) -> int:
        conns = list(self._conns)
        for conn in conns:
            conn.reset()
        # Let the aborted transports actually close their sockets before returning.
        for _ in range(3):
            await asyncio.sleep(0)
        return len(conns)

    def set_latency(self, seconds: float) -> None:
        """Delay every Redis -> client chunk by ``seconds`` (0 disables)."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        self._latency = float(seconds)

    def blackhole(self, on: bool) -> None:
        """While on, read from both sides but forward nothing. A connection that swallowed
        data stays dead after the blackhole ends (its RESP stream is no longer in sync)."""
        self._blackholing = bool(on)

    def refuse(self, on: bool) -> None:
        """While on, reset new connections as soon as they are accepted."""
        self._refusing = bool(on)

    def set_upstream(self, port: int) -> None:
        """Point new connections at another loopback Redis (failover tests)."""
        self.upstream_port = int(port)
