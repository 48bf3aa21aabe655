"""``chongming-redis worker`` processes started by another process: the demo, the stress
harness and the tests all start, kill and stop their workers through :class:`WorkerProcesses`.

Each process is tracked by its pid and ended by it (never by name). A worker's owner name in
the pool is ``<nodename>-<pid>`` (:meth:`WorkerProcesses.owner`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from chongming_redis.stores.urls import StoreUrlError, parse_store_url


def store_option(url: str) -> str:
    """``--redis`` for a Redis URL (as the workers were always started), else ``--store``."""
    try:
        return "--redis" if parse_store_url(url).kind == "redis" else "--store"
    except StoreUrlError:
        return "--redis"  # the worker says what is wrong with it, as it always did


class WorkerProcesses:
    """Workers of ``app_spec`` in one namespace of the store at ``url`` (any store URL: a SQLite
    file's namespace is ``default``); ``options`` are the worker command's options
    (``--concurrency=4``, ...). With ``logdir`` each process's stdout and stderr go to
    ``worker-<n>.log`` there, else to /dev/null."""

    def __init__(
        self,
        app_spec: str,
        url: str,
        namespace: str,
        options: Sequence[str] = (),
        *,
        logdir: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.app_spec, self.url, self.namespace = app_spec, url, namespace
        self.options = list(options)
        self.logdir, self.env, self.cwd = logdir, dict(env) if env else None, cwd
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.spawned = 0
        self.unexpected_exits = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def command(
        self, options: Sequence[str] | None = None, module: str = "chongming_redis.cli"
    ) -> list[str]:
        return [
            sys.executable, "-m", module, "worker", self.app_spec,
            f"{store_option(self.url)}={self.url}", f"--namespace={self.namespace}",
            *(self.options if options is None else options),
        ]  # fmt: skip

    def spawn(
        self,
        options: Sequence[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        module: str = "chongming_redis.cli",
    ) -> int:
        """Start one worker (``options`` replace the default ones; ``env`` adds to the
        environment; ``module`` is what ``python -m`` runs with the worker's arguments, e.g. a
        wrapper of the command line); returns its pid."""
        command = self.command(options, module)
        base = self.env if self.env is not None else os.environ
        env = {**base, **env} if env else self.env
        with self._lock:
            self.spawned += 1
            if self.logdir is None:
                proc = subprocess.Popen(
                    command, cwd=self.cwd, env=env,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            else:
                with open(self.logdir / f"worker-{self.spawned}.log", "ab") as log:
                    proc = subprocess.Popen(command, cwd=self.cwd, env=env, stdout=log, stderr=log)
            self.procs[proc.pid] = proc
            return proc.pid

    @staticmethod
    def owner(pid: int) -> str:
        """The pool name a worker process gives itself."""
        return f"{os.uname().nodename}-{pid}"

    def live_pids(self) -> list[int]:
        with self._lock:
            return sorted(p for p, proc in self.procs.items() if proc.poll() is None)

    def reap(self, pid: int) -> None:
        """Forget a process that has ended (or is about to: waits up to 10 s)."""
        with self._lock:
            proc = self.procs.pop(pid, None)
        if proc is not None:
            proc.wait(10)

    def terminate(self, pid: int, timeout: float = 15.0) -> None:
        """Stop one worker gracefully (SIGCONT, SIGTERM; SIGKILL after ``timeout``) and forget
        it first, so that ``keep_alive`` does not count it as an unexpected exit."""
        with self._lock:
            proc = self.procs.pop(pid, None)
        if proc is None or proc.poll() is not None:
            return
        os.kill(pid, signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill9(self, pid: int) -> None:
        """SIGKILL one worker and reap it."""
        os.kill(pid, signal.SIGKILL)
        self.reap(pid)

    def keep_alive(self, interval: float = 0.5) -> None:
        """From now on, replace workers that exit on their own (counted in
        ``unexpected_exits``), e.g. because Redis was down when they started."""

        def loop() -> None:
            while not self._stop.wait(interval):
                with self._lock:
                    dead = [p for p, proc in self.procs.items() if proc.poll() is not None]
                for pid in dead:
                    self.reap(pid)
                    self.unexpected_exits += 1
                    self.spawn()

        self._keeper = threading.Thread(target=loop, name="worker-keeper", daemon=True)
        self._keeper.start()

    def stop_all(self, timeout: float = 15.0) -> None:
        """SIGTERM every worker (SIGCONT first: a stopped one cannot handle it), wait up to
        ``timeout`` for all of them, then SIGKILL the rest."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(5)
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def logs(self, tail: int = 2000) -> str:
        """The end of every worker's log (when there is a ``logdir``)."""
        if self.logdir is None:
            return ""
        return "\n".join(
            f"--- {p.name}:\n{p.read_text(errors='replace')[-tail:]}"
            for p in sorted(self.logdir.glob("worker-*.log"))
        )
