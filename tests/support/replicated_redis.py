"""Replicated Redis for tests: a primary, its replicas, and Redis Sentinels watching them, all
real processes on free loopback ports (the package's launcher; each in a directory of its own).

* ``start_primary()`` starts a server that sends a new replica its first copy at once
  (``repl-diskless-sync-delay 0``: Redis 7 waits 5 s for more replicas to share it);
* ``start_replica(primary_port)`` starts a ``redis-server --replicaof 127.0.0.1 <port>`` (with
  the same setting, for when it is promoted) and returns once its link to the primary is up and
  the first sync is done.
* ``wait_replicas(server, n)``: until ``server`` counts ``n`` connected, in-sync replicas.
* ``Sentinels(primary_port, count)``: ``count`` Sentinels (``redis-server <conf>
  --sentinel``) monitoring the primary as ``SERVICE`` with short timeouts (a primary is judged
  down after ``DOWN_AFTER_MS``), returned once every Sentinel knows the others and the
  replicas. ``url`` is the ``redis+sentinel://`` URL of all of them.

Processes are tracked and ended by their own pid.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from chongming_redis.embedded.redis_server import LOOPBACK, free_port
from tests.support.redis_server import RedisProc, redis_server_path

__all__ = [
    "DOWN_AFTER_MS",
    "SERVICE",
    "Sentinels",
    "start_primary",
    "start_replica",
    "wait_replicas",
]

SERVICE = "chongming"
#: How long a Sentinel waits before it judges a silent primary down (ms).
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 3000
#: A replica's first sync starts at once instead of after 5 s.
PROMPT_SYNC = ("--repl-diskless-sync-delay", "0")


def wait_until(what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll ``check`` until it is true; ``AssertionError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def start_primary() -> RedisProc:
    return RedisProc(extra_args=PROMPT_SYNC)


def start_replica(primary_port: int, *, extra_args: tuple[str, ...] = ()) -> RedisProc:
    """A replica of the server on ``primary_port`` (or of whatever listens there: a proxy),
    once its first sync is done."""
    replica = RedisProc(
        extra_args=(*PROMPT_SYNC, "--replicaof", LOOPBACK, str(primary_port), *extra_args)
    )
    try:
        with replica.client(socket_timeout=2) as client:
            wait_until(f"replica {replica.port} in sync",
                       lambda: _linked(client.info("replication")))  # fmt: skip
    except BaseException:
        replica.close()
        raise
    return replica


def _linked(info: dict[str, Any]) -> bool:
    return info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")


@contextmanager
def primary_with_replica() -> Iterator[tuple[RedisProc, RedisProc]]:
    """A primary and one replica already in sync with it; both closed at the end."""
    primary = start_primary()
    try:
        replica = start_replica(primary.port)
        try:
            wait_replicas(primary, 1)
            yield primary, replica
        finally:
            replica.close()
    finally:
        primary.close()


def wait_replicas(server: RedisProc, count: int, timeout: float = 15.0) -> None:
    """Until ``server`` is a primary with ``count`` replicas online (``WAIT`` on it can then
    count them)."""
    with server.client(socket_timeout=2) as client:

        def online() -> bool:
            info = client.info("replication")
            states = [v.get("state") for k, v in info.items() if k.startswith("slave")]
            return info.get("role") == "master" and states.count("online") >= count

        wait_until(f"{count} replica(s) online on {server.port}", online, timeout)


def role_of(port: int) -> str:
    with redis.Redis(host=LOOPBACK, port=port, socket_timeout=2) as client:
        return str(client.info("replication").get("role"))


class Sentinels:
    """``count`` Sentinels monitoring the primary on ``primary_port`` (quorum: a majority),
    ready once each knows the others and the primary's ``replicas``."""

    def __init__(self, primary_port: int, count: int = 3, *, replicas: int = 1) -> None:
        binary = redis_server_path()
        if binary is None:
            raise RuntimeError("redis-server is not on PATH (apt-get install -y redis-server)")
        self.binary = binary
        self.quorum = count // 2 + 1
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dir = Path(tempfile.mkdtemp(prefix="chongming-sentinel-test-"))
        try:
            for _ in range(count):
                self._start_one(primary_port)
            self.wait_ready(replicas)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        hosts = ",".join(f"{LOOPBACK}:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def _start_one(self, primary_port: int) -> None:
        port = free_port()
        # Nothing listens on a port given out until its sentinel starts: the next free_port
        # may hand out the same one again (CI met it: two sentinels, one port).
        while (self.dir / str(port)).exists():
            port = free_port()
        home = self.dir / str(port)
        home.mkdir()
        conf = home / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind {LOOPBACK}\ndaemonize no\ndir {home}\n"
            f"logfile {home / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} {LOOPBACK} {primary_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        with open(home / "stderr.log", "ab") as stderr:
            proc = subprocess.Popen([self.binary, str(conf), "--sentinel"],
                                    stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
        self.procs.append(proc)
        self.ports.append(port)

    def client(self, index: int = 0) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=self.ports[index], socket_timeout=2,
                           decode_responses=True)  # fmt: skip

    def master_state(self, index: int = 0) -> dict[str, Any]:
        with self.client(index) as client:
            state: dict[str, Any] = client.execute_command("SENTINEL", "MASTER", SERVICE)
            return state

    def wait_ready(self, replicas: int | None = None, timeout: float = 20.0) -> None:
        """Until every Sentinel knows the others and (``replicas``) that many replicas."""
        others = len(self.ports) - 1

        def ready() -> bool:
            for i in range(len(self.ports)):
                state = _pairs(self.master_state(i))
                if int(state["num-other-sentinels"]) < others:
                    return False
                if replicas is not None and int(state["num-slaves"]) < replicas:
                    return False
            return True

        wait_until("Sentinels ready", ready, timeout)

    def primary_port(self, index: int = 0) -> int:
        with self.client(index) as client:
            _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            return int(port)

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until every Sentinel names a primary other than ``old_port`` and that server says
        it is one; returns its port."""

        def moved() -> bool:
            ports = {self.primary_port(i) for i in range(len(self.ports))}
            return len(ports) == 1 and old_port not in ports and role_of(ports.pop()) == "master"

        wait_until(f"failover away from {old_port}", moved, timeout)
        return self.primary_port()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:]
                         for p in sorted(self.dir.glob("*/sentinel.log")))  # fmt: skip


def _pairs(state: Any) -> dict[str, Any]:
    """``SENTINEL MASTER``'s reply as a dict (RESP2 gives a flat list)."""
    if isinstance(state, dict):
        return state
    return dict(zip(state[::2], state[1::2]))
