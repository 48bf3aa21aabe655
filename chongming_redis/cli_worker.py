"""``chongming-redis worker``: one worker in this process, or N forked worker processes under a
supervising parent (``worker_parent``), with a private Redis when none is given; the worker's
log lines (``--log-level``) and its retry policy (``--max-attempts``, ``--retry-backoff``)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from chongming_redis.cli_common import UserError, err, load_app, open_store, shown_url, user_errors

if TYPE_CHECKING:  # imported by the commands that need it: the CLI starts fast
    from chongming_redis.runtime.config import ControllerConfig
    from chongming_redis.runtime.retry import RetryPolicy

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: ``2026-03-01 13:00:05.123 INFO    reconnected to Redis after 12.0 s (40 failed call(s))``
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(message)s"
CTRL_C = "press Ctrl-C to stop (a second Ctrl-C hands running tasks back at once)"

_CHILD_MODULES = (
    "chongming_redis.runtime.controller",
    "chongming_redis.runtime.pool",
    "chongming_redis.stores.redis",
)


@dataclass(frozen=True)
class WorkerOptions:
    app_spec: str
    redis: str | None
    namespace: str
    config: ControllerConfig
    num_buckets: int
    worker_lease: float
    grace: float
    retry: RetryPolicy | None = None
    log_level: str = "INFO"


def log_level(text: str) -> str:
    """``--log-level``, any case; another value is a ``UserError``."""
    level = text.upper()
    if level not in LOG_LEVELS:
        raise UserError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, not {text!r}")
    return level


def configure_logging(level: str) -> None:
    """One line per record on stderr: time, level, message. The runtime logs on the loggers
    ``chongming_redis.*`` (a line per task start and end at INFO); a task's own loggers
    show too."""
    from chongming_redis.log_writer import BatchingHandler, SecondsFormatter

    # Not a StreamHandler: two lines per task, written in the task threads, cost a worker
    # 40 % of its throughput (log_writer.py).
    handler = BatchingHandler(sys.stderr)
    handler.setFormatter(SecondsFormatter(LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    # The format names no thread or process: a record need not look them up (a few us each).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def say_ctrl_c_once_handled(timeout: float = 60.0) -> None:
    """Print how Ctrl-C stops the worker once a SIGINT handler is installed (``run_forever``,
    or the ``--processes`` parent, installs it after this call): the hint is true when it
    appears, and a test or a user acting on it never interrupts the start-up instead."""
    before = signal.getsignal(signal.SIGINT)

    def wait() -> None:
        deadline = time.monotonic() + timeout
        while signal.getsignal(signal.SIGINT) == before:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        err.print(CTRL_C, highlight=False, soft_wrap=True)

    threading.Thread(target=wait, name="ctrl-c-hint", daemon=True).start()


def run_worker(options: WorkerOptions, *, announce: bool = True) -> None:
    """One worker in this process: join the pool, run until SIGTERM/SIGINT. ``announce``:
    say how Ctrl-C stops it (the ``--processes`` parent says it once for its children)."""
    from chongming_redis.runtime.buckets import BucketPolicy
    from chongming_redis.runtime.controller import Controller
    from chongming_redis.runtime.retry import RetryPolicy

    store = open_store(options.redis, options.namespace)
    owner = f"{os.uname().nodename}-{os.getpid()}"
    retry = options.retry or RetryPolicy()
    controller = Controller(store, app=load_app(options.app_spec), owner=owner,
                            config=options.config, retry=retry,
                            buckets=BucketPolicy(options.num_buckets))  # fmt: skip
    controller.join_pool(worker_lease=options.worker_lease)
    logging.getLogger("chongming_redis.worker").info(
        "worker %s: namespace %r on %s, %d slots, up to %d attempts per task",
        owner, options.namespace, shown_url(options.redis or ""), options.config.concurrency,
        retry.max_attempts,
    )  # fmt: skip
    if announce:
        say_ctrl_c_once_handled()
    # Under a --processes parent (announce=False) a signal may arrive twice, directly and
    # forwarded: a repeat within 2 s is the same request. A lone worker gets each one once.
    controller.run_forever(grace=options.grace, same_signal_within=0.0 if announce else 2.0)


def run_workers(options: WorkerOptions, processes: int) -> None:
    """Start ``processes`` worker processes (and a private Redis if none is given) and keep
    them running (``worker_parent``; each child is forked from this process, which has
    imported the app); exits non-zero when they cannot start."""
    from chongming_redis.embedded import EmbeddedRedis
    from chongming_redis.worker_parent import supervise_children

    # The runtime is imported here once (run_worker's imports): a forked child starts with it
    # loaded instead of importing it again, on every child at once.
    for module in _CHILD_MODULES:
        importlib.import_module(module)
    embedded = None
    if not options.redis:
        embedded = EmbeddedRedis().start()
        options = dataclasses.replace(options, redis=embedded.url)
        err.print(f"started a private {embedded.describe()} at {options.redis}",
                  highlight=False, soft_wrap=True)  # fmt: skip

    def child() -> None:
        try:
            with user_errors():
                run_worker(options, announce=False)
        except typer.Exit as exc:  # a one-line error was printed: exit with its status
            raise SystemExit(exc.exit_code) from None
        except KeyboardInterrupt:  # forwarded before its handler was installed: stop quietly
            raise SystemExit(130) from None

    say_ctrl_c_once_handled()
    try:
        status = supervise_children(
            child, processes, say=lambda line: err.print(line, highlight=False, soft_wrap=True)
        )
    finally:
        if embedded is not None:
            embedded.stop()
    if status != 0:
        raise typer.Exit(status)
