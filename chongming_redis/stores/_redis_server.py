"""What ``RedisTaskStore`` asks of the server it is given: whether it understands script
flags (Redis 7), and whether its settings can lose or evict acknowledged data."""

from __future__ import annotations

import logging

import redis

from chongming_redis.stores._replies import text as _text

log = logging.getLogger("chongming_redis.store")


def supports_script_flags(client: redis.Redis) -> bool:
    """Redis >= 7 understands ``#!lua`` shebangs and ``EVALSHA_RO``; older servers and
    fakeredis do not (and fakeredis changes its reply shapes after HELLO, so it is not
    asked)."""
    if type(client).__module__.startswith("fakeredis"):
        return False
    try:
        hello = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except redis.exceptions.ResponseError:
        return False
    info = dict(zip(hello[::2], hello[1::2])) if isinstance(hello, list) else hello
    server = _text(info.get(b"server", b""))
    version = _text(info.get(b"version", b"0"))
    if server != "redis":
        return False
    return int(version.split(".")[0]) >= 7


def check_server_settings(client: redis.Redis) -> list[str]:
    """Warn (log) when the server can lose or evict acknowledged data; return the warnings.

    Reads only INFO; where the ACL forbids it the check is skipped with a log line.
    """
    try:
        memory = client.info("memory")
        persistence = client.info("persistence")
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
        log.warning("chongming-redis: %s", problem)
    return problems
