"""What every system's run shares: the private Redis, the per-process byte files that count
the jobs, starting and stopping a worker command, and the small facts printed with a run."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

from bench.peers.mark import DIR_ENV, URL_ENV
from chongming_redis.embedded.redis_server import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's console scripts sit next to its python


@dataclass(frozen=True)
class System:
    """One benchmarked system. ``enqueue_*`` take ``(url, namespace, n)`` and return
    ``(seconds, handle)``: the seconds of the enqueue loop alone (client set-up excluded) and
    what ``check`` needs afterwards. ``worker_command(url, namespace, processes)`` is the
    system's own CLI with its defaults except the process count."""

    name: str
    module: str  # imported to tell whether the system is installed
    packages: tuple[str, ...]  # distributions whose versions are printed
    enqueue_one_by_one: Callable[[str, str, int], tuple[float, Any]]
    enqueue_bulk: Callable[[str, str, int], tuple[float, Any]] | None
    worker_command: Callable[[str, str, int], list[str]]
    check: Callable[[str, str, Any, int], dict[str, Any]] | None = None
    bulk_note: str = ""

    def installed(self) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(self.module) is not None
        except ImportError:
            return False


def start_redis() -> EmbeddedRedis:
    """A private redis-server from PATH on a free loopback port, no persistence at all."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench.peers needs redis-server on PATH (apt-get install redis-server)")
    server = EmbeddedRedis(binary=binary, port=0, prefix="bench-peers-",
                           extra_args=("--appendonly", "no", "--save", ""))  # fmt: skip
    return server.start()


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def settle_clients(client: redis.Redis, timeout: float = 5.0) -> None:
    """Wait until only ``client`` is connected: connections (and their buffers) of clients
    and workers that are gone must not count as job memory."""
    deadline = time.monotonic() + timeout
    while int(client.info("clients")["connected_clients"]) > 1 and time.monotonic() < deadline:
        time.sleep(0.02)


class Marks:
    """The byte files of one run: ``runs/<pid>`` (one byte per job) and ``first/<pid>`` (the
    wall time of each process's first job), see ``bench.peers.mark``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.rmtree(root, ignore_errors=True)
        (root / "runs").mkdir(parents=True)
        (root / "first").mkdir()

    def _stats(self) -> list[os.stat_result]:
        found = []
        for entry in os.scandir(self.root / "runs"):
            with contextlib.suppress(FileNotFoundError):
                found.append(entry.stat())
        return found

    def count(self) -> int:
        return sum(s.st_size for s in self._stats())

    def split(self) -> dict[int, int]:
        """Jobs run per process: pid -> bytes of ``runs/<pid>``, most jobs first (a process that
        ran no job, such as a supervising parent, has no file)."""
        found = {}
        for entry in os.scandir(self.root / "runs"):
            with contextlib.suppress(FileNotFoundError):
                found[int(entry.name)] = entry.stat().st_size
        return dict(sorted(found.items(), key=lambda item: -item[1]))

    def last_ns(self) -> int:
        """When the last job ran: the newest ``st_mtime_ns`` of the byte files."""
        return max(s.st_mtime_ns for s in self._stats())

    def firsts(self) -> dict[int, int]:
        """pid -> wall time (ns) of that process's first job."""
        found = {int(p.name): int(p.read_text() or 0) for p in (self.root / "first").iterdir()}
        return {pid: t for pid, t in found.items() if t > 0}

    def first_ns(self) -> int | None:
        times = self.firsts().values()
        return min(times) if times else None


@dataclass
class Drain:
    start_ns: int  # wall time just before the worker command was spawned
    end_ns: int | None  # the last job's byte (None: not every job ran)
    first_ns: int | None  # the first job of any process
    error: str | None = None

    @property
    def seconds(self) -> float | None:
        return None if self.end_ns is None else (self.end_ns - self.start_ns) / 1e9

    @property
    def warm_seconds(self) -> float | None:
        if self.end_ns is None or self.first_ns is None:
            return None
        return (self.end_ns - self.first_ns) / 1e9


def worker_env(url: str, marks: Marks) -> dict[str, str]:
    env = dict(os.environ)
    env[DIR_ENV] = str(marks.root)
    env[URL_ENV] = url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def drain(
    command: list[str], env: dict[str, str], marks: Marks, n: int, log: Path, timeout: float
) -> tuple[subprocess.Popen[bytes], Drain]:
    """Spawn ``command`` (a session of its own) and poll the byte files until ``n`` jobs ran;
    returns the still-running process for ``stop``."""
    with open(log, "wb") as out:
        start_ns = time.time_ns()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + timeout
    while marks.count() < n:
        if proc.poll() is not None:
            return proc, Drain(start_ns, None, marks.first_ns(),
                               f"exited {proc.returncode} after {marks.count()} jobs")  # fmt: skip
        if time.monotonic() > deadline:
            return proc, Drain(start_ns, None, marks.first_ns(),
                               f"only {marks.count()}/{n} jobs within {timeout:.0f}s")  # fmt: skip
        time.sleep(0.01)
    return proc, Drain(start_ns, marks.last_ns(), marks.first_ns())


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> str:
    """SIGTERM the command, SIGKILL its whole session after ``timeout``; wait until none of its
    processes is left. Returns how it ended."""
    how = "exited by itself" if proc.poll() is not None else "SIGTERM"
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            how = f"SIGKILL (no exit {timeout:.0f}s after SIGTERM)"
            _kill_group(proc.pid)
            proc.wait(10)
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid):
        if time.monotonic() > deadline:
            how += "; leftover children SIGKILLed"
            _kill_group(proc.pid)
            break
        time.sleep(0.05)
    return how


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def log_tail(log: Path, chars: int = 1500) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def versions(systems: list[System]) -> dict[str, str]:
    found: dict[str, str] = {"python": sys.version.split()[0]}
    for package in ("redis", *(p for s in systems for p in s.packages)):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    binary = shutil.which("redis-server") or "redis-server"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    found["redis-server"] = out.split("v=", 1)[1].split()[0] if "v=" in out else out.strip()
    return found
