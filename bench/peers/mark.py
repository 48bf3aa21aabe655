"""The one thing every benchmarked no-op job does: append one byte to a file of its process.

``mark()`` is the whole body of the no-op job of all four systems. The first job of a process
opens ``$BENCH_PEERS_DIR/runs/<pid>`` (``O_APPEND``, so threads of one process never overwrite
each other's byte) and writes the wall time of that first job to ``$BENCH_PEERS_DIR/first/<pid>``
(once per process, not per job); every job then costs one ``os.write`` of one byte and no Redis
work. The harness sums the sizes of ``runs/*`` to see how many jobs ran.
"""

from __future__ import annotations

import os
import threading
import time

DIR_ENV = "BENCH_PEERS_DIR"
URL_ENV = "BENCH_PEERS_REDIS_URL"

_fd: int | None = None
_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _fd
    _fd = None


os.register_at_fork(after_in_child=_reset_after_fork)


def _open() -> int:
    global _fd
    with _lock:
        if _fd is None:
            started = time.time_ns()
            root = os.environ[DIR_ENV]
            pid = str(os.getpid())
            with open(os.path.join(root, "first", pid), "w") as first:
                first.write(str(started))
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            _fd = os.open(os.path.join(root, "runs", pid), flags, 0o644)
        return _fd


def mark() -> None:
    """Record that one job ran: one byte appended to this process's file."""
    fd = _fd
    if fd is None:
        fd = _open()
    os.write(fd, b".")


def redis_url() -> str:
    """The benchmark's Redis, for the app modules that the workers import."""
    return os.environ[URL_ENV]
