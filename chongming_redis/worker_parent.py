"""The parent of ``chongming-redis worker --processes N``: starts N worker children and keeps
them running.

* A child that exits with an error within ``startup`` seconds of its first start could not
  start (Redis unreachable, a bad app, a bucket-count mismatch): the parent stops the others
  and exits with that child's status, so a service manager (systemd, Kubernetes) sees the
  failure and restarts it — it never exits 0 for a pool that never ran.
* A child that dies later (killed, crashed) is restarted with backoff (1 s, doubling, at most
  ``max_backoff``), and the parent logs it; capacity never halves silently. A child that keeps
  dying at once ``give_up_after`` times in a row ends the parent with an error.
* SIGTERM/SIGINT are forwarded to the children; then nothing is restarted and the parent exits
  0 once they have shut down.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class _Child:
    slot: int
    proc: subprocess.Popen[bytes]
    started_at: float
    failures: int = 0  # deaths in a row soon after a start


def supervise_children(
    command: Sequence[str],
    processes: int,
    *,
    say: Callable[[str], None],
    startup: float = 3.0,
    max_backoff: float = 30.0,
    give_up_after: int = 5,
    poll: float = 0.2,
) -> int:
    """Run ``processes`` children of ``command``; returns the parent's exit status."""
    stopping = threading.Event()
    children = [_spawn(command, slot) for slot in range(max(1, processes))]

    def forward(signum: int, frame: Any) -> None:
        stopping.set()
        for child in children:
            if child.proc.poll() is None:
                child.proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    first_round = True
    while True:
        if stopping.is_set():
            for child in children:
                child.proc.wait()
            return 0
        for i, child in enumerate(children):
            code = child.proc.poll()
            if code is None or stopping.is_set():
                continue
            quick = time.monotonic() - child.started_at < startup
            if first_round and quick and code != 0:
                say(f"worker process {child.slot} could not start (exit {code}); stopping")
                _stop_all(children)
                return code if code > 0 else 1
            child.failures = child.failures + 1 if quick else 1
            if child.failures > give_up_after:
                say(f"worker process {child.slot} keeps dying (exit {code}); giving up")
                _stop_all(children)
                return 1
            delay = min(max_backoff, 2.0 ** (child.failures - 1))
            say(f"worker process {child.slot} (pid {child.proc.pid}) exited with {code}; "
                f"restarting in {delay:.0f}s")  # fmt: skip
            if stopping.wait(delay):
                break
            children[i] = _spawn(command, child.slot, failures=child.failures)
        if first_round and all(time.monotonic() - c.started_at >= startup for c in children):
            first_round = False
        stopping.wait(poll)


def _spawn(command: Sequence[str], slot: int, failures: int = 0) -> _Child:
    return _Child(slot, subprocess.Popen(list(command)), time.monotonic(), failures)


def _stop_all(children: list[_Child]) -> None:
    for child in children:
        if child.proc.poll() is None:
            child.proc.terminate()
    for child in children:
        try:
            child.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
