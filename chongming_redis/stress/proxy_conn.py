"""One proxied connection of the fault proxy: the client->Redis and Redis->client pumps,
the delivery queue that applies latency, and the drop/blackhole/refuse decisions per connection.

Split out of :mod:`chongming_redis.stress.fault_proxy` (see its docstring for the toxics); the
facade :class:`~chongming_redis.stress.fault_proxy.FaultProxy` owns the shared toxic state and
this module reads it through the proxy it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chongming_redis.stress.proxy_resp import RespError, parse_request, reply_end

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from chongming_redis.stress.fault_proxy import FaultProxy

_READ_SIZE = 65536
_QUEUE_CHUNKS = 256
_CLOSE = object()  # delivery-queue sentinel: upstream closed, flush then close the client
_RESET = object()  # delivery-queue sentinel: reset both sides (after earlier data is delivered)

# After these a connection carries unsolicited messages, so replies no longer map to requests.
_UNTRACKED_AFTER = frozenset({b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"MONITOR"})

# Toxic names used as keys of ``FaultProxy.fired``.
DROP_REPLY = "drop_reply_of"
RESET_ALL = "reset_all"
LATENCY = "latency"
BLACKHOLE = "blackhole"
REFUSE = "refuse"


@dataclass
class DropReply:
    """An armed ``drop_reply_of`` toxic. ``seen`` counts matching requests since arming."""

    command: bytes
    nth: int
    seen: int = 0
    fired: int = 0
    fired_event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def armed(self) -> bool:
        return self.seen < self.nth

    def wait_fired(self, timeout: float = 5.0) -> bool:
        return self.fired_event.wait(timeout)


def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Close a connection with SO_LINGER 0, so the peer gets a TCP RST instead of a FIN."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Conn:
    """One client connection and its upstream connection."""

    def __init__(
        self, proxy: FaultProxy, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.creader = creader
        self.cwriter = cwriter
        self.ureader: asyncio.StreamReader | None = None
        self.uwriter: asyncio.StreamWriter | None = None
        self.pending: deque[DropReply | None] = deque()
        self.tracked = not proxy.raw  # a raw proxy forwards bytes from the start
        self.blackholed = False  # swallowed data once: never forwards again
        self.closed = False
        self.queue: asyncio.Queue[tuple[float, object]] = asyncio.Queue(_QUEUE_CHUNKS)
        self.tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        proxy = self.proxy
        if proxy._refusing:
            proxy._fire(REFUSE)
            self.reset()
            return
        try:
            self.ureader, self.uwriter = await asyncio.wait_for(
                asyncio.open_connection(proxy.upstream_host, proxy.upstream_port),
                proxy.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError):
            with proxy._lock:
                proxy._upstream_failures += 1
            self.reset()
            return
        if self.closed:  # reset_all/close while connecting
            _rst(self.uwriter)
            return
        self.tasks = [
            asyncio.create_task(self._guard(self._client_to_upstream)),
            asyncio.create_task(self._guard(self._upstream_to_client)),
            asyncio.create_task(self._guard(self._deliver)),
        ]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.reset()

    async def _guard(self, pump: Callable[[], Awaitable[None]]) -> None:
        # The pump's coroutine is made here, inside the task: a task cancelled before its first
        # step (a reset while connecting) then leaves no coroutine that was never awaited
        # (CI saw that warning, raised as an error by pytest, fail a failover run).
        try:
            await pump()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.reset()

    def reset(self) -> None:
        """RST both sides and stop every pump of this connection (idempotent; a connection
        that already closed gracefully is not reset)."""
        if not self.closed:
            self.closed = True
            _rst(self.cwriter)
            _rst(self.uwriter)
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current and not task.done():
                task.cancel()

    def _swallow(self) -> bool:
        """True when data must be discarded (blackhole on now, or this connection was hit)."""
        if self.blackholed:
            return True
        if self.proxy._blackholing:
            self.blackholed = True
            self.proxy._fire(BLACKHOLE)
            return True
        return False

    async def _client_to_upstream(self) -> None:
        assert self.uwriter is not None
        buf = bytearray()
        while True:
            data = await self.creader.read(_READ_SIZE)
            if not data:
                if not self.uwriter.is_closing() and self.uwriter.can_write_eof():
                    self.uwriter.write_eof()
                return
            if self._swallow():
                continue
            if self.tracked:
                buf += data
                # Parse before forwarding so a request is pending before its reply can exist.
                self._parse_requests(buf)
            self.uwriter.write(data)
            await self.uwriter.drain()

    def _parse_requests(self, buf: bytearray) -> None:
        pos = 0
        names: list[bytes] = []
        try:
            while True:
                parsed = parse_request(buf, pos)
                if parsed is None:
                    break
                pos, name = parsed
                if name is not None:
                    names.append(name)
            broken = False
        except RespError:
            broken = True
        del buf[:pos]
        for name in names:
            self.pending.append(self.proxy._on_request(name) if self.tracked else None)
            if name in _UNTRACKED_AFTER:
                self.tracked = False
        if broken or not self.tracked:
            self.tracked = False
            self.pending.clear()
            buf.clear()

    async def _upstream_to_client(self) -> None:
        assert self.ureader is not None
        loop = asyncio.get_running_loop()
        buf = bytearray()
        while True:
            data = await self.ureader.read(_READ_SIZE)
            if not data:
                if buf and not self.blackholed:
                    await self.queue.put((loop.time() + self.proxy._latency, bytes(buf)))
                await self.queue.put((loop.time() + self.proxy._latency, _CLOSE))
                return
            if self._swallow():
                continue
            if not self.tracked:
                await self._enqueue(loop, data)
                continue
            buf += data
            pos = 0
            doomed: DropReply | None = None
            try:
                while True:
                    if pos < len(buf) and buf[pos] == ord(">"):  # RESP3 push: no request
                        end = reply_end(buf, pos)
                        if end is None:
                            break
                        pos = end
                        continue
                    end = reply_end(buf, pos)
                    if end is None:
                        break
                    owner = self.pending.popleft() if self.pending else None
                    if owner is not None:
                        doomed = owner
                        break
                    pos = end
            except RespError:
                self.tracked = False
                pos = len(buf)
            if pos:
                await self._enqueue(loop, bytes(buf[:pos]))
            del buf[:pos]
            if doomed is not None:
                # The doomed request ran and its whole reply is here: swallow it and reset.
                self.proxy._fire(DROP_REPLY, doomed)
                await self.queue.put((loop.time() + self.proxy._latency, _RESET))
                return

    async def _enqueue(self, loop: asyncio.AbstractEventLoop, data: bytes) -> None:
        latency = self.proxy._latency
        if latency > 0:
            self.proxy._fire(LATENCY)
        await self.queue.put((loop.time() + latency, data))

    async def _deliver(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, item = await self.queue.get()
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if item is _RESET:
                self.reset()
                return
            if item is _CLOSE:
                self.closed = True
                self.cwriter.close()
                if self.uwriter is not None:
                    self.uwriter.close()
                for task in self.tasks:
                    if task is not asyncio.current_task() and not task.done():
                        task.cancel()
                return
            self.cwriter.write(item)  # type: ignore[arg-type]
            await self.cwriter.drain()
