"""The nemesis: a fault schedule derived from the seed, executed on real processes, counted.

Kinds (every one is scheduled at least once; the run fails if a scheduled fault did not fire):

``worker_kill``         SIGKILL a random worker process, then start a replacement
``lease_holder_pause``  SIGSTOP a worker that holds a RUNNING task for 3 x the task lease, then
                        SIGCONT (Kleppmann's pause: the zombie must be fenced)
``proxy_latency``       the proxy delays every Redis -> worker chunk for 2 s
``drop_reply``          the proxy forwards the n-th EVALSHA, swallows its reply and resets the
                        connection (the ambiguity fault: the script ran, the client cannot know)
``reset_connections``   the proxy resets every open worker connection
``redis_restart``       kill -9 of redis-server (appendfsync always), restart on the same port
                        (only of a server the run started itself: never of a ``--redis``)
``server_restart``      on a SQL store, in ``redis_restart``'s place: kill -9 of the private
                        PostgreSQL (every process of it), restart on the same data directory
                        (skipped on SQLite, which has no server, and on a given server)
``clock_skew``          start a worker whose wall clock is 300 s ahead or behind (libfaketime),
                        then stop one of the others gracefully (SIGTERM: it hands its tasks
                        back); fired once the skewed worker ran a task and the clock it
                        recorded is really that far off the server's (skipped without
                        libfaketime). It stays in the pool until the end, or a later kill.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from chongming_redis.embedded.workers import WorkerProcesses
    from chongming_redis.stress.fault_proxy import FaultProxy

KINDS = (
    "worker_kill",
    "lease_holder_pause",
    "proxy_latency",
    "drop_reply",
    "reset_connections",
    "redis_restart",
    "clock_skew",
)
#: How far the ``clock_skew`` fault moves a worker's wall clock, in seconds (either way).
SKEW_SECONDS = 300
#: The faults the proxy applies (skipped when the workers cannot be proxied).
PROXY_KINDS = ("proxy_latency", "drop_reply", "reset_connections")
#: ``redis_restart``'s place on a SQL store (``KINDS`` stays as it is: the Redis schedules
#: of every seed do not change).
SERVER_RESTART = "server_restart"


class Restartable(Protocol):
    """A server the run started itself (``EmbeddedRedis``, ``PostgresProc``)."""

    def kill9(self) -> None: ...

    def restart(self) -> None: ...


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start of the run
    kind: str
    arg: int  # kind-specific choice drawn from the seed (which worker, which EVALSHA, ...)


def schedule(seed: int, seconds: float, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """Every kind once, plus one more random fault per 10 s, at seeded times within the first
    ~65% of the run (tasks keep arriving until 85%; the rest is for recovery and the drain)."""
    rng = random.Random(seed)
    chosen = list(kinds) + [rng.choice(kinds) for _ in range(int(seconds // 10))]
    rng.shuffle(chosen)
    start, end = min(2.0, seconds * 0.1), max(seconds * 0.65, 3.0)
    times = sorted(rng.uniform(start, end) for _ in chosen)
    return [
        Fault(round(t, 2), k, rng.randrange(1, 1_000_000))
        for t, k in zip(times, chosen, strict=True)
    ]


@dataclass
class Nemesis:
    """Executes a schedule, one fault at a time, in its own thread."""

    plan: list[Fault]
    workers: WorkerProcesses
    proxy: FaultProxy | None  # None when the workers cannot be proxied
    redis: Restartable | None  # the run's own server; None when the run uses --redis
    holders: Callable[[], dict[int, list[str]]]  # pid -> task ids it holds RUNNING
    task_lease: float
    log: Callable[[dict[str, Any]], None]
    #: starts a worker whose wall clock is the given seconds off; returns its pid
    spawn_skewed: Callable[[int], int] | None = None
    #: the wall clock minus the server's that a worker process recorded when it began its
    #: first task (``stress_app.clocks_key``), or ``None`` before
    clock_of: Callable[[int], float | None] | None = None
    scheduled: Counter[str] = field(default_factory=Counter)
    fired: Counter[str] = field(default_factory=Counter)
    paused_tasks: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self.scheduled.update(f.kind for f in self.plan)
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._thread.start()

    def running(self) -> bool:
        """Faults are still to come (or one is being applied)."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        for fault in self.plan:
            delay = self._t0 + fault.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            began = time.monotonic() - self._t0
            try:
                ok, detail = getattr(self, "_" + fault.kind)(fault.arg)
            except Exception as exc:  # a fault that could not be applied did not fire
                ok, detail = False, f"error: {exc!r}"
            if ok:
                self.fired[fault.kind] += 1
            self.log(
                {
                    "op": "fault",
                    "kind": fault.kind,
                    "at": round(began, 2),
                    "fired": ok,
                    "detail": detail,
                }
            )

    # -- the faults ------------------------------------------------------------------------

    def _worker_kill(self, arg: int) -> tuple[bool, str]:
        pids = self.workers.live_pids()
        if not pids:
            return False, "no live worker"
        pid = pids[arg % len(pids)]
        os.kill(pid, signal.SIGKILL)
        self.workers.reap(pid)
        new = self.workers.spawn()
        return True, f"killed {pid}, started {new}"

    def _lease_holder_pause(self, arg: int) -> tuple[bool, str]:
        deadline = time.monotonic() + 20
        error = ""
        while time.monotonic() < deadline:
            try:
                holders = self.holders()
            except Exception as exc:  # e.g. Redis restarting: look again
                error = f" (last error: {exc!r})"
                time.sleep(0.2)
                continue
            live = self.workers.live_pids()
            held = {p: t for p, t in holders.items() if t and p in live}
            if held:
                pids = sorted(held)
                pid = pids[arg % len(pids)]
                os.kill(pid, signal.SIGSTOP)
                self.paused_tasks.extend(held[pid])
                try:
                    time.sleep(3 * self.task_lease)
                finally:
                    os.kill(pid, signal.SIGCONT)
                return True, f"stopped {pid} holding {held[pid]} for {3 * self.task_lease:.1f}s"
            time.sleep(0.1)
        return False, "no worker held a running task within 20 s" + error

    def _proxy_latency(self, arg: int) -> tuple[bool, str]:
        assert self.proxy is not None  # not scheduled without one
        before = self.proxy.fired.get("latency", 0)
        seconds = 0.02 + (arg % 8) / 100
        self.proxy.set_latency(seconds)
        # At least 2 s, and on until a chunk was delayed (at most 15 s, as a dropped reply
        # waits): on a loaded machine the workers can send nothing for 2 s (CI saw "0 chunks"
        # right after a worker kill), and a fault that delayed nothing proves nothing.
        time.sleep(2.0)
        deadline = time.monotonic() + 13.0
        while self.proxy.fired.get("latency", 0) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        self.proxy.set_latency(0)
        delayed = self.proxy.fired.get("latency", 0) - before
        return delayed > 0, f"{seconds * 1000:.0f} ms on {delayed} chunks"

    def _drop_reply(self, arg: int) -> tuple[bool, str]:
        assert self.proxy is not None
        nth = 1 + arg % 20
        toxic = self.proxy.drop_reply_of("EVALSHA", nth=nth)
        ok = toxic.wait_fired(timeout=15)
        if not ok:
            self.proxy.clear()
        return ok, f"reply of EVALSHA #{nth} dropped" if ok else "no EVALSHA within 15 s"

    def _reset_connections(self, arg: int) -> tuple[bool, str]:
        assert self.proxy is not None
        # Right after a Redis restart or a reset no worker may be connected yet: wait (bounded)
        # for connections to reset rather than record a fault that did nothing.
        deadline = time.monotonic() + 5.0
        count = self.proxy.reset_all()
        while count == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
            count = self.proxy.reset_all()
        return count > 0, f"{count} connections reset"

    def _redis_restart(self, arg: int) -> tuple[bool, str]:
        if self.redis is None:
            return False, "no private redis-server (--redis given)"
        self.redis.kill9()
        time.sleep(0.2 + (arg % 10) / 10)
        self.redis.restart()
        return True, "redis-server killed -9 and restarted"

    def _server_restart(self, arg: int) -> tuple[bool, str]:
        if self.redis is None:
            return False, "no private server (a given one is never killed)"
        self.redis.kill9()
        time.sleep(0.2 + (arg % 10) / 10)
        self.redis.restart()
        return True, "the store's server killed -9 (every process) and restarted"

    def _clock_skew(self, arg: int) -> tuple[bool, str]:
        if self.spawn_skewed is None or self.clock_of is None:
            return False, "no way to start a skewed worker (libfaketime missing)"
        skew = SKEW_SECONDS if arg % 2 else -SKEW_SECONDS
        others = self.workers.live_pids()
        pid = self.spawn_skewed(skew)
        detail = f"started {pid} with its clock {skew:+d} s off"
        if others:  # keep the pool's size: one of the others hands its tasks back
            victim = others[arg % len(others)]
            self.workers.terminate(victim)
            detail += f", stopped {victim} (SIGTERM)"
        deadline = time.monotonic() + 30
        offset = None
        while offset is None and time.monotonic() < deadline:
            try:
                offset = self.clock_of(pid)
            except Exception:  # e.g. Redis restarting: look again
                offset = None
            if offset is None:
                time.sleep(0.2)
        if offset is None:
            return False, detail + "; it ran no task within 30 s"
        detail += f"; it ran a task with its wall clock {offset:+.1f} s off the server's"
        return abs(offset - skew) < SKEW_SECONDS / 10, detail
