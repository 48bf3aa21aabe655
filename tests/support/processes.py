"""Real OS processes for the cross-process tests (``python -m tests.support.workers <role>``):
start them, talk to them over stdin/stdout, and always reap them.

``tests/test_cross_process.py`` (the races, on every store) and
``tests/test_redis_cross_process.py`` (kill -9 of redis-server) use them.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    name: str
    stderr_path: Path
    buffer: bytes = b""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def read_json(self, timeout: float = 15.0) -> dict[str, Any]:
        """The next stdout line as JSON, waiting at most ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no line within {timeout}s; {self.stderr()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"{self.name} closed stdout; {self.stderr()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def stderr(self) -> str:
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return f"stderr of {self.name}:\n{text[-3000:]}"


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
