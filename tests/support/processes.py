"""Real OS processes for the cross-process tests (``python -m tests.support.workers <role>``):
start them, talk to them over stdin/stdout, and always reap them.

``stress/test_cross_process.py`` (the races, on every store) and
``stress/test_redis_cross_process.py`` (kill -9 of redis-server) use them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chongming_redis.testing.processes import Worker

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Spawner:
    """Starts worker processes and always reaps them: SIGKILL by pid for any still running."""

    tmp: Path
    workers: list[Worker] = field(default_factory=list)

    def start(self, role: str, name: str, *args: str) -> Worker:
        stderr_path = self.tmp / f"{name}.stderr"
        with stderr_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.workers", role, "--name", name, *args],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                bufsize=0,
            )
        worker = Worker(proc, name, stderr_path)
        self.workers.append(worker)
        return worker

    def wait_all(self, timeout: float, workers: list[Worker] | None = None) -> None:
        """Wait for ``workers`` (default: all) to exit, each with status 0."""
        deadline = time.monotonic() + timeout
        for worker in self.workers if workers is None else workers:
            try:
                code = worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{worker.name} still running; {worker.stderr()}") from None
            assert code == 0, f"{worker.name} exited with {code}; {worker.stderr()}"

    def cleanup(self) -> None:
        for worker in self.workers:
            proc = worker.proc
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)  # only pids this spawner started
            proc.wait(10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with suppress(BrokenPipeError):
                        pipe.close()


@contextmanager
def spawner(tmp: Path) -> Iterator[Spawner]:
    spawned = Spawner(tmp)
    try:
        yield spawned
    finally:
        spawned.cleanup()


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
