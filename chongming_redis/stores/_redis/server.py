"""What ``RedisTaskStore`` asks of the server it is given: whether it understands script
flags (Redis 7, Valkey), and whether its settings can lose or evict acknowledged data."""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from chongming_redis.stores._redis.replies import text as _text

log = logging.getLogger("chongming_redis.store")

#: ``(server, problem)`` pairs already warned about by this process (and, through ``fork``, by
#: its parent): a worker's every store, thread and reconnect would otherwise repeat them.
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()

#: The first major version that understands script flags, by the name ``HELLO`` gives: Valkey,
#: forked from Redis 7.2, has them in every release (and names itself from 8.0 on).
SCRIPT_FLAGS_SINCE = {"redis": 7, "valkey": 7}


def supports_script_flags(client: redis.Redis) -> bool:
    """Redis >= 7 and Valkey understand ``#!lua`` shebangs and ``EVALSHA_RO``; older servers
    and fakeredis do not (and fakeredis changes its reply shapes after HELLO, so it is not
    asked)."""
    if type(client).__module__.startswith("fakeredis"):
        return False
    try:
        hello = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except redis.exceptions.ResponseError:
        return False
    return hello_supports_flags(hello)


def hello_supports_flags(hello: Any) -> bool:
    """Whether a ``HELLO`` reply (a flat list in RESP2, a map in RESP3) comes from a server
    that understands script flags, ``SCRIPT_FLAGS_SINCE`` (the sync store asks above,
    ``AsyncRedisTaskStore`` with its own client)."""
    info = dict(zip(hello[::2], hello[1::2])) if isinstance(hello, list) else hello
    since = SCRIPT_FLAGS_SINCE.get(_text(info.get(b"server", b"")))
    major = _text(info.get(b"version", b"0")).split(".")[0]
    # A version that is not a number (a fork's own scheme) gets the legacy scripts: safe.
    return since is not None and major.isdigit() and int(major) >= since


def check_server_settings(client: redis.Redis) -> list[str]:
    """Warn (log) when the server can lose or evict acknowledged data; return the warnings.

    Each warning is logged once per process and server; every call returns them all. Reads
    only INFO; where the ACL forbids it the check is skipped with a log line.
    """
    try:
        memory = client.info("memory")
        persistence = client.info("persistence")
        server = _server_of(client, client.info("server"))
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
        with _warned_lock:
            first = (server, problem) not in _warned
            _warned.add((server, problem))
        if first:
            log.warning("chongming-redis: %s", problem)
    return problems


def _server_of(client: redis.Redis, info: dict[str, object]) -> str:
    """Which server process a client talks to: its ``run_id`` (new at every start, so a
    restarted server or another one on the same port is warned about again), else the
    address."""
    if info.get("run_id"):
        return str(info["run_id"])
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', '')}:{kwargs.get('port', '')}"
