"""The parent of ``chongming-redis worker --processes N``: starts N worker children and keeps
them running.

* A child that exits with an error within ``startup`` seconds of its first start could not
  start (Redis unreachable, a bad app, a bucket-count mismatch): the parent stops the others
  and exits with that child's status, so a service manager (systemd, Kubernetes) sees the
  failure and restarts it — it never exits 0 for a pool that never ran.
* A child that dies later (killed, crashed) is restarted with backoff (1 s, doubling, at most
  ``max_backoff``), and the parent logs it; capacity never halves silently. A child that keeps
  dying at once ``give_up_after`` times in a row ends the parent with an error.
* SIGTERM/SIGINT are passed on to the children; then nothing is restarted and the parent exits
  0 once they have shut down. A forked child hears its parent through a pipe (``control``):
  ``b"1"`` asks for a graceful shutdown, ``b"2"`` (the parent's second signal: a second
  Ctrl-C) for handing the running tasks back at once, and the end of the pipe — the parent
  gone, however it died, SIGKILL included — for a graceful shutdown: a child never outlives
  its parent serving buckets. A signal that reaches a child directly (a terminal's Ctrl-C
  goes to the whole process group, systemd's ``KillMode=control-group`` to every process)
  asks for the graceful shutdown only, so each request counts once, through the parent.

Children are forked from the parent (``ForkedChild``) once it has imported the app: a child
starts in milliseconds instead of paying a fresh interpreter and its imports (~0.2 s), which is
most of a short drain's start-up. The parent starts no threads and opens no connections before
it forks, except with ``--metrics-port``: the metrics endpoint's listening socket (which each
child closes first thing) and its server thread, which touches nothing a child uses. A command
line (``subprocess``) works the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chongming_redis.runtime.signals import GRACEFUL, NOW

#: The signals that stop a worker (the parent passes both on to its children).
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
#: In a forked child: the read end of its control pipe (``None`` in any other process).
_control_fd: int | None = None


def parent_control() -> int | None:
    """In a child forked by ``ForkedChild``: the file descriptor of its control pipe (read
    it for the parent's requests; its end means the parent is gone), else ``None``."""
    return _control_fd


class ChildProcess(Protocol):
    """What the parent needs of a child: ``subprocess.Popen`` or ``ForkedChild``."""

    pid: int

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, signum: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class ForkedChild:
    """A child forked from this process that runs ``main()`` and exits with its status
    (``SystemExit`` codes kept; an exception prints its traceback and exits 1). The subset
    of ``subprocess.Popen`` the parent uses."""

    def __init__(self, main: Callable[[], None]) -> None:
        global _control_fd
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        # SIGINT/SIGTERM are blocked across the fork: one that reaches the new child before
        # it has its own handler stays pending until it has one (``_run_child``), never runs
        # a handler inherited from the parent, and is never lost.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns into the parent's code
                os.close(write_end)  # only the parent holds it: its end is the parent's death
                _control_fd = read_end
                os._exit(_run_child(main, mask))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(read_end)
        # A later child must not inherit this one's pipe (it would keep it open).
        os.set_inheritable(write_end, False)
        self.pid = pid
        self.returncode: int | None = None
        self.control: int | None = write_end

    def request_stop(self, *, now: bool) -> None:
        """Ask the child to shut down (``now``: hand its running tasks back at once)."""
        if self.control is None or self.poll() is not None:
            return
        with contextlib.suppress(OSError):  # it exited meanwhile (EPIPE): nothing to ask
            os.write(self.control, NOW if now else GRACEFUL)

    def _close_control(self) -> None:
        if self.control is not None:
            os.close(self.control)
            self.control = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self._close_control()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _stop_before_ready(signum: int, frame: Any) -> None:
    """A stop signal that reached a child before its worker installed its own handlers: the
    child has started nothing yet, so it stops at once (exit 130)."""
    raise KeyboardInterrupt


def _run_child(main: Callable[[], None], mask: Iterable[int]) -> int:
    # Not the parent's forwarding handlers, and not SIG_DFL: a signal that arrived while they
    # were blocked (and was pending since the fork) must stop the child, not be dropped by
    # Python for finding no handler to run. The worker's run_forever replaces these.
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop_before_ready)
    code = 0
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        main()
    except KeyboardInterrupt:  # stopped before the worker's handlers were installed
        code = 130
    except SystemExit as exc:
        if isinstance(exc.code, int):
            code = exc.code if 0 <= exc.code <= 255 else 1
        elif exc.code is not None:  # sys.exit("message"): print it, as Python does
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


@dataclass
class _Child:
    slot: int
    proc: ChildProcess
    started_at: float
    failures: int = 0  # deaths in a row soon after a start


def supervise_children(
    command: Sequence[str] | Callable[[], None],
    processes: int,
    *,
    say: Callable[[str], None],
    startup: float = 3.0,
    max_backoff: float = 30.0,
    give_up_after: int = 5,
    poll: float = 0.2,
    on_exit: Callable[[int], None] | None = None,
) -> int:
    """Run ``processes`` children of ``command`` (a command line, or a function each forked
    child runs); returns the parent's exit status. ``on_exit(pid)``: a child exited (before
    its restart, if any; the metrics drop its gauges)."""
    stopping = threading.Event()
    children = [_spawn(command, slot) for slot in range(max(1, processes))]

    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        # Only note it: the loop forwards it to the children there are then (one being
        # restarted included), and no child is waited for inside a signal handler.
        received.append(signum)
        stopping.set()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    first_round = True
    while True:
        if stopping.is_set():
            _stop_children(children, received, poll)
            return 0
        for i, child in enumerate(children):
            code = child.proc.poll()
            if code is None or stopping.is_set():
                continue
            if on_exit is not None:
                on_exit(child.proc.pid)
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


def _stop_children(children: list[_Child], received: list[int], poll: float) -> None:
    """Pass the stop on, then wait for every child: the first signal asks each for a graceful
    shutdown, any later one (a second Ctrl-C, while they shut down) for handing back now."""
    passed = 0
    while True:
        for index in range(passed, len(received)):  # the handler appends as signals come
            for child in children:
                _request_stop(child.proc, received[index], now=index > 0)
            passed = index + 1
        if all(child.proc.poll() is not None for child in children):
            return
        time.sleep(poll / 4)


def _request_stop(proc: ChildProcess, signum: int, *, now: bool) -> None:
    if isinstance(proc, ForkedChild):
        proc.request_stop(now=now)
    elif proc.poll() is None:  # a command line: the signal itself
        proc.send_signal(signum)


def _spawn(command: Sequence[str] | Callable[[], None], slot: int, failures: int = 0) -> _Child:
    proc: ChildProcess = (
        ForkedChild(command) if callable(command) else subprocess.Popen(list(command))
    )
    return _Child(slot, proc, time.monotonic(), failures)


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
