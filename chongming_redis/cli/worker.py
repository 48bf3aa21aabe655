"""``chongming-redis worker``: one worker in this process, or N forked worker processes under a
supervising parent (``worker_parent``), with a private Redis when none is given; the worker's
log lines (``--log-level``), its retry policy (``--max-attempts``, ``--retry-backoff``) and its
Prometheus endpoint (``--metrics-port``: served by the lone worker, or by the parent for all
its children)."""

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
from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer

from chongming_redis.cli.common import (
    ERRORED,
    LAST_WORD,
    BucketsOpt,
    ClusterOpt,
    DurabilityOpt,
    MaxAttemptsOpt,
    NamespaceOpt,
    RedisOpt,
    RetryBackoffOpt,
    StoreOpt,
    UserError,
    load_app,
    open_store,
    retry_policy,
    store_target,
    user_errors,
    where,
)
from chongming_redis.cli.registry import Commands
from chongming_redis.cli.worker_metrics import (
    check_metrics_port,
    metrics_shared,
    serve_metrics,
    worker_metrics,
)

if TYPE_CHECKING:  # imported by the commands that need it: the CLI starts fast
    from chongming_redis.policy import RetryPolicy
    from chongming_redis.runtime.config import ControllerConfig

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: ``2026-03-01 13:00:05.123 INFO    reconnected to Redis after 12.0 s (40 failed call(s))``
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(message)s"
CTRL_C = "press Ctrl-C to stop (a second Ctrl-C hands running tasks back at once)"

commands = Commands()
_CHILD_MODULES = ("chongming_redis.runtime.controller", "chongming_redis.runtime.pool")


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
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no metrics
    #: Under a --processes parent with metrics: where its children write their series.
    metrics_dir: str | None = None
    #: ``--store``: any store's URL (``redis`` is then ``None``).
    store_url: str | None = None
    #: ``--durability-replicas``: writes wait for that many Redis replicas.
    durability_replicas: int = 0
    #: ``--cluster``: the Redis URL names a node of a Redis Cluster.
    cluster: bool = False
    #: ``--replace-limits``: record the app's limit definitions over differing recorded ones.
    replace_limits: bool = False


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
    from chongming_redis.cli.log_writer import BatchingHandler, SecondsFormatter

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
        with LAST_WORD:  # never after an error: that stays the last line
            if not ERRORED.is_set():  # plain: rich (~20 ms to import) would race the first task
                sys.stderr.write(CTRL_C + "\n")
                sys.stderr.flush()

    threading.Thread(target=wait, name="ctrl-c-hint", daemon=True).start()


def run_worker(options: WorkerOptions, *, child: bool = False) -> None:
    """One worker in this process: join the pool, run until SIGTERM/SIGINT. ``child``: under
    a ``--processes`` parent, which says how Ctrl-C stops them and serves their metrics."""
    from chongming_redis.policy import worker_default
    from chongming_redis.runtime.buckets import BucketPolicy
    from chongming_redis.runtime.controller import Controller

    app = load_app(options.app_spec)
    events = worker_metrics(
        options.metrics_host, options.metrics_port, app, serve=not child
    )  # the port first: fail fast
    store = open_store(options.redis, options.namespace, store_url=options.store_url,
                       create=True, durability_replicas=options.durability_replicas,
                       cluster=options.cluster, check_server=True)  # fmt: skip
    owner = f"{os.uname().nodename}-{os.getpid()}"
    retry = options.retry or worker_default()
    config = polling_for(store, options.config)
    controller = Controller(store, app=app, owner=owner, config=config, retry=retry,
                            buckets=BucketPolicy(options.num_buckets), events=events,
                            replace_limits=options.replace_limits)  # fmt: skip
    controller.record_limits()  # a LimitConflict: one line (user_errors), nothing started
    controller.join_pool(worker_lease=options.worker_lease)
    logging.getLogger("chongming_redis.worker").info(
        "worker %s: %s, %d slots, up to %d attempts per task",
        owner, where(options.namespace, options.redis or options.store_url),
        options.config.concurrency, retry.max_attempts,
    )  # fmt: skip
    if not child:
        say_ctrl_c_once_handled()
    # Under a --processes parent the requests come through the control pipe (its end: the
    # parent died), and a signal that reaches the child directly only asks for the graceful
    # shutdown (runtime/signals.py). A lone worker gets each signal once.
    from chongming_redis.cli.worker_parent import parent_control

    controller.run_forever(grace=options.grace, parent=parent_control() if child else None)


#: How often a worker on a store without nudges (SQLite) looks for new tasks and for
#: commands. Nudges wake a Redis or PostgreSQL worker at once, so it polls every 1 s and 0.5 s
#: only as a fallback; without them the poll is the reaction time: 0.2 s keeps an idle worker's
#: start of a new task and its answer to a stop within about 0.2 s (p50 0.1 s; docs/runtime.md),
#: for about ten cheap queries a second per worker.
UNNUDGED_POLL = 0.2


def polling_for(store: object, config: ControllerConfig) -> ControllerConfig:
    """``config``, with the start and command polls at most ``UNNUDGED_POLL`` on a store that
    cannot nudge (not a ``NudgeStore``, or one with its nudges off: no namespace)."""
    from chongming_redis.stores.extensions import NudgeStore

    if isinstance(store, NudgeStore) and store.namespace:
        return config
    return dataclasses.replace(
        config,
        start_poll_interval=min(config.start_poll_interval, UNNUDGED_POLL),
        command_poll_interval=min(config.command_poll_interval, UNNUDGED_POLL),
    )


def run_workers(options: WorkerOptions, processes: int) -> None:
    """Start ``processes`` worker processes (and a private Redis if none is given) and keep
    them running (``worker_parent``; each child is forked from this process, which has
    imported the app); exits non-zero when they cannot start. With ``metrics_dir``, serve
    the sum of the children's metrics."""
    from chongming_redis.cli.worker_parent import supervise_children
    from chongming_redis.embedded.redis_server import EmbeddedRedis

    # The runtime is imported here once (run_worker's imports): a forked child starts with it
    # loaded instead of importing it again, on every child at once.
    for module in (*_CHILD_MODULES, _store_module(options)):
        importlib.import_module(module)
    path, server, on_exit = options.metrics_dir, None, None
    if path is not None:  # before the private Redis: a taken port fails with nothing to undo
        from chongming_redis.metrics.worker import child_exited, shared_registry

        server = serve_metrics(shared_registry(path), options.metrics_host, options.metrics_port,
                               say=_say)  # fmt: skip
        on_exit = partial(child_exited, path)
    embedded = None

    def child() -> None:
        if server is not None:  # the parent's: a child that outlived it must not hold the port
            server.socket.close()
        try:
            with user_errors():
                run_worker(options, child=True)
        except typer.Exit as exc:  # a one-line error was printed: exit with its status
            raise SystemExit(exc.exit_code) from None
        except KeyboardInterrupt:  # forwarded before its handler was installed: stop quietly
            raise SystemExit(130) from None

    try:
        if not options.redis and not options.store_url:
            embedded = EmbeddedRedis().start()
            options = dataclasses.replace(options, redis=embedded.url)
            _say(f"started a private {embedded.describe()} at {options.redis}")
        record_limits_once(options)
        say_ctrl_c_once_handled()
        status = supervise_children(child, processes, say=_say, on_exit=on_exit)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if embedded is not None:
            embedded.stop()
    if status != 0:
        raise typer.Exit(status)


def record_limits_once(options: WorkerOptions) -> None:
    """The parent records the app's limits before any child starts: a conflict is then one
    line, not one per child (each child records them again, the same: no conflict)."""
    from chongming_redis.runtime.store_adapter import StoreAdapter

    definitions, task_limits = load_app(options.app_spec).limit_definitions()
    if not definitions:
        return
    store = open_store(options.redis, options.namespace, store_url=options.store_url,
                       create=True, check_server=False, cluster=options.cluster)  # fmt: skip
    try:
        StoreAdapter(store).record_limits(definitions, task_limits, replace=options.replace_limits)
    finally:
        store.close()


def _store_module(options: WorkerOptions) -> str:
    """The store's module, for the parent to import before it forks (a bad URL: the children
    say so, each on one line)."""
    from chongming_redis.stores.urls import StoreUrlError, parse_store_url

    try:
        return parse_store_url(options.store_url or options.redis or "redis://").module
    except StoreUrlError:
        return "chongming_redis.stores.redis"


def _say(line: str) -> None:
    """A line of the ``--processes`` parent: printed, not logged (a log line would start the
    log writer's thread in the parent before it forks)."""
    from chongming_redis.cli.common import err

    err.print(line, highlight=False, soft_wrap=True)


# -- the command -------------------------------------------------------------------------------


@commands.command(
    epilog="Example: chongming-redis worker tasks:app --redis redis://127.0.0.1:6379/0 "
    "--processes 2 --concurrency 8 --max-attempts 5 --retry-backoff 2 --log-level INFO "
    "--metrics-port 9100"
)
def worker(
    app_spec: Annotated[str, typer.Argument(metavar="APP", help="package.module:app")],
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
    concurrency: Annotated[int, typer.Option(help="tasks run at once per process")] = 4,
    prefetch: Annotated[
        int,
        typer.Option(help="at most this many started tasks wait for a slot (0: none, so RUNNING "
                     "means a slot runs it; more: throughput for short tasks, a waiting task "
                     "shows as RUNNING)"),
    ] = 0,
    processes: Annotated[int, typer.Option(help="worker processes to start")] = 1,
    num_buckets: BucketsOpt = 64,
    task_lease: Annotated[float, typer.Option(help="seconds")] = 30.0,
    worker_lease: Annotated[float, typer.Option(help="seconds")] = 5.0,
    grace: Annotated[float, typer.Option(help="shutdown grace, seconds")] = 30.0,
    max_attempts: MaxAttemptsOpt = 3,
    retry_backoff: RetryBackoffOpt = 1.0,
    level: Annotated[
        str,
        typer.Option("--log-level",
                     help=f"one of {', '.join(LOG_LEVELS)} (one line per task at INFO)"),
    ] = "INFO",
    metrics_port: Annotated[
        int,
        typer.Option("--metrics-port",
                     help="serve Prometheus metrics on this port at /metrics (0: none); with "
                          "--processes the parent serves the sum of its workers'"),
    ] = 0,
    metrics_host: Annotated[
        str, typer.Option(help="the address --metrics-port listens on")
    ] = "127.0.0.1",
    replace_limits: Annotated[
        bool,
        typer.Option("--replace-limits",
                     help="record this app's limit definitions over the ones recorded in the "
                          "store (default: a different one refuses to start)"),
    ] = False,
) -> None:  # fmt: skip
    """Run tasks of APP: join the namespace's pool and serve a share of its buckets.

    Without --redis or --store it starts a private Redis (redis-server from PATH, else the
    embedded extra's) and says which. --store sqlite:///path runs on a SQLite file (created if
    missing; the workers of one machine share it), --store postgresql://... on PostgreSQL (the
    namespace is the schema; LISTEN/NOTIFY nudges its workers); on SQLite, without nudges, it
    polls for work and commands every 0.2 s. Ctrl-C stops gracefully; a second one hands
    running tasks back.
    """
    with user_errors():
        from chongming_redis.runtime.config import ControllerConfig

        if processes < 1:
            raise UserError(f"--processes must be at least 1, not {processes}")
        retry = retry_policy(max_attempts, retry_backoff)
        level = log_level(level)
        port = check_metrics_port(metrics_port)
        if redis or store_url:  # a bad URL: one line here, not one per worker process
            store_target(redis, store_url, namespace)
        elif durability_replicas:
            raise UserError("--durability-replicas needs --redis: a private Redis has no "
                            "replicas")  # fmt: skip
        elif cluster:
            raise UserError("--cluster needs --redis: a private Redis is not a cluster")
        parent = processes > 1 or not (redis or store_url)
        # Before the app is imported: it may import prometheus_client (metrics/shared.py).
        with metrics_shared(port > 0 and parent) as metrics_dir:
            load_app(app_spec)
            config = ControllerConfig(
                concurrency=concurrency, prefetch=prefetch, task_lease=task_lease,
                reconcile_interval=max(0.5, min(5.0, task_lease / 2)),
                command_poll_interval=0.5, start_poll_interval=1.0,
            )  # fmt: skip
            options = WorkerOptions(app_spec, redis, namespace, config, num_buckets,
                                    worker_lease, grace, retry=retry, log_level=level,
                                    metrics_host=metrics_host, metrics_port=port,
                                    metrics_dir=metrics_dir, store_url=store_url,
                                    durability_replicas=durability_replicas,
                                    cluster=cluster, replace_limits=replace_limits)  # fmt: skip
            configure_logging(level)
            if parent:
                run_workers(options, processes)
            else:
                run_worker(options)


register = commands.register
