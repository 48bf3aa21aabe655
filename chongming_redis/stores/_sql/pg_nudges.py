"""``PostgresTaskStore``'s nudges: redis-py's pub/sub surface (``publish``, ``pubsub``) on
PostgreSQL ``LISTEN``/``NOTIFY``, so the runtime's listener (``runtime/notify.py``) runs on it
unchanged (``NudgeStore``).

* **Channels.** The runtime names a nudge ``{namespace}:nudge:<topic>`` (``work``, ``pool``, a
  worker's owner id). PostgreSQL channels are identifiers of at most 63 bytes, and a topic is
  any owner id, so each is hashed: ``chongming_nudge_`` + 40 hex digits of its SHA-256. The
  namespace (the schema) is in the hash, so two schemas of one database never wake each other;
  ``NOTIFY`` never leaves its database.
* **Sending.** The store's writes that make a task ``PENDING`` send ``work`` in their own
  transaction (``PostgresTaskStore._nudge_work``): PostgreSQL delivers it at the commit, and
  never for a rolled-back write. ``publish`` (the runtime's other nudges) is one statement in a
  transaction of its own on the store's pool.
* **Listening.** A ``PgPubSub`` holds one dedicated autocommit connection (not the pool's: it
  stays in ``LISTEN``). A lost connection raises from ``get_message``; the runtime's listener
  then closes it and subscribes again on a new one, polling covering the gap.
"""

from __future__ import annotations

import hashlib
import select
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

_PREFIX = "chongming_nudge_"


def pg_channel(channel: str) -> str:
    """The PostgreSQL channel of the runtime's channel ``channel`` (56 ASCII bytes)."""
    return _PREFIX + hashlib.sha256(channel.encode("utf-8")).hexdigest()[:40]


class PgNudgeClient:
    """What the runtime's ``RedisNotifier`` needs of a client: ``publish`` and ``pubsub``.

    ``send(pg_channel)``: sends one ``NOTIFY`` (the store's, on its pool); ``dsn`` and
    ``connect_timeout``: for the listeners' own connections."""

    def __init__(self, dsn: str, *, connect_timeout: float, send: Callable[[str], None]) -> None:
        self._dsn = dsn
        self._options: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in conninfo_to_dict(dsn):
            self._options["connect_timeout"] = max(1, round(connect_timeout))
        self._send = send

    def publish(self, channel: str, message: object = b"1") -> int:
        """Nudge ``channel`` (the payload is not sent: a nudge says only "look now"). Raises
        ``StoreError`` when the server cannot be reached (the runtime logs and polls)."""
        self._send(pg_channel(channel))
        return 0  # NOTIFY does not say how many listen

    def pubsub(self, ignore_subscribe_messages: bool = True) -> PgPubSub:
        """A new listener (no connection until its first ``subscribe``)."""
        return PgPubSub(lambda: psycopg.connect(self._dsn, **self._options))


class PgPubSub:
    """redis-py's ``PubSub`` as the runtime uses it: ``subscribe``, ``get_message``,
    ``close``. Messages are ``{"type": "message", "channel": <the runtime's name, bytes>,
    "data": b"1"}``; a lost connection raises ``psycopg.OperationalError``."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self._connect = connect
        self._connection: psycopg.Connection[Any] | None = None
        self._names: dict[str, str] = {}  # pg channel -> the runtime's channel
        self._pending: deque[dict[str, Any]] = deque()
        self._unread = False

    def subscribe(self, *channels: str) -> None:
        if self._connection is None:
            self._connection = self._connect()
        for channel in channels:
            name = pg_channel(channel)
            self._connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
            self._names[name] = channel
        self._unread = True  # a reply may have brought a notification with it: look once

    def get_message(self, timeout: float = 0.0) -> dict[str, Any] | None:
        """The next nudge, waiting at most ``timeout`` seconds; ``None`` if none came."""
        if self._connection is None:  # nothing subscribed: nothing can come
            time.sleep(timeout)
            return None
        deadline = time.monotonic() + timeout
        while not self._pending:
            if self._unread:  # psycopg may hold some already: no wait for the socket
                self._unread = False
            elif not _readable(self._connection, max(0.0, deadline - time.monotonic())):
                return None
            self._take(self._connection)
            if time.monotonic() >= deadline:
                break
        return self._pending.popleft() if self._pending else None

    def _take(self, connection: psycopg.Connection[Any]) -> None:
        """The notifications psycopg has or can read now (a lost connection raises)."""
        for notify in connection.notifies(timeout=0.0):
            channel = self._names.get(notify.channel)
            if channel is not None:
                self._pending.append(
                    {"type": "message", "channel": channel.encode("utf-8"), "data": b"1"}
                )

    def close(self) -> None:
        connection, self._connection = self._connection, None
        self._names.clear()
        if connection is not None:
            with suppress(Exception):
                connection.close()


def _readable(connection: psycopg.Connection[Any], timeout: float) -> bool:
    """Whether the server sent something (a notification, or the end of the connection)
    within ``timeout``: a ``select`` is cheap, psycopg's own wait costs ~1 ms of CPU a call,
    and the runtime's listener asks 50 times a second."""
    return bool(select.select([connection.fileno()], [], [], timeout)[0])
