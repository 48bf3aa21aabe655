"""The ``chongming-redis`` command line.

Every command takes ``--redis URL`` (or ``CHONGMING_REDIS_URL``), or any store's URL with
``--store URL`` (or ``CHONGMING_STORE_URL``: ``sqlite:///path``, ``postgresql://...``;
``stores/urls.py``), and ``--namespace``. A user mistake (unknown task, bad URL, the store down,
bad JSON, a bad option value) prints one line and exits 1, no traceback. The read commands
print tables for people (``cli_render``) and take ``--json`` for scripts (``cli_json``
documents the keys).
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Annotated, Any, TypeVar

import typer

from chongming_redis.cli import control as cli_control
from chongming_redis.cli import dashboard as cli_dashboard
from chongming_redis.cli import read as cli_read
from chongming_redis.cli.common import (
    BucketsOpt,
    ClusterOpt,
    DurabilityOpt,
    MaxAttemptsOpt,
    NamespaceOpt,
    RedisOpt,
    RetryBackoffOpt,
    StoreOpt,
    UserError,
    console,
    err,
    load_app,
    open_store,
    progress,
    retry_policy,
    say_error,
    store_target,
    user_errors,
)
from chongming_redis.cli.worker import (
    LOG_LEVELS,
    WorkerOptions,
    check_metrics_port,
    configure_logging,
    log_level,
    metrics_shared,
    run_worker,
    run_workers,
)

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
T = TypeVar("T")
#: ``submit --count``: tasks per round trip (``Controller.submit_many`` batches up to 100).
SUBMIT_BATCH = 100
#: ``prune``: terminal tasks dropped per step of the progress bar.
PRUNE_STEP = 1000
#: ``submit --delay``: at most about 31 years.
MAX_DELAY = 1e9


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"chongming-redis {version('chongming-redis')}", highlight=False)
        except PackageNotFoundError:
            console.print("chongming-redis (not installed: version unknown)", highlight=False)
        raise typer.Exit(0)


@app.callback(
    epilog="Example: export CHONGMING_REDIS_URL=redis://127.0.0.1:6379/0; "
    "chongming-redis worker tasks:app; chongming-redis submit tasks:app resize --count 10; "
    "chongming-redis tasks --status running"
)
def root(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_version,
                     help="print the version and exit"),
    ] = False,
) -> None:  # fmt: skip
    """chongming-redis: run, submit, inspect and control tasks kept in Redis (or, with --store,
    in SQLite or PostgreSQL)."""


def _cli_owner() -> str:
    return f"cli-{os.uname().nodename}-{os.getpid()}"


# -- commands ----------------------------------------------------------------------------------


@app.command(
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
        int, typer.Option(help="at most this many started tasks wait for a slot (0: none)")
    ] = 64,
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
) -> None:  # fmt: skip
    """Run tasks of APP: join the namespace's pool and serve a share of its buckets.

    Without --redis or --store it starts a private Redis (redis-server from PATH, else the
    embedded extra's) and says which. --store sqlite:///path runs on a SQLite file (created if
    missing; the workers of one machine share it), --store postgresql://... on PostgreSQL (the
    namespace is the schema); without Redis's nudges it polls for work and commands every
    0.2 s. Ctrl-C stops gracefully; a second one hands running tasks back.
    """
    with user_errors():
        from chongming_redis.runtime.config import ControllerConfig

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
                                    cluster=cluster)  # fmt: skip
            configure_logging(level)
            if parent:
                run_workers(options, processes)
            else:
                run_worker(options)


@app.command(
    epilog="Example: chongming-redis submit tasks:app resize --params '{\"width\": 640}' "
    "--count 100 --delay 30 --tag batch"
)
def submit(
    app_spec: Annotated[str, typer.Argument(metavar="APP")],
    name: Annotated[str, typer.Argument(help="task type")],
    params: Annotated[str, typer.Option(help="JSON parameters")] = "null",
    key: Annotated[str | None, typer.Option(help="bucket key (default: task id)")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="repeatable")] = None,
    count: Annotated[int, typer.Option(help="submit this many")] = 1,
    delay: Annotated[
        float, typer.Option(help="seconds from now before the task may start (sets not_before)")
    ] = 0.0,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
    num_buckets: Annotated[
        int | None,
        typer.Option("--num-buckets", help="the namespace's bucket count (default: recorded)"),
    ] = None,
) -> None:
    """Submit tasks; prints their ids, one per line (a bar on a terminal for --count)."""
    with user_errors():
        if count < 1:
            raise UserError(f"--count must be at least 1, not {count}")
        if not (math.isfinite(delay) and 0 <= delay <= MAX_DELAY):
            raise UserError(f"--delay must be a number of seconds from 0 to {MAX_DELAY:.0f}, "
                            f"not {delay}")  # fmt: skip
        try:
            decoded = json.loads(params)
        except json.JSONDecodeError as exc:
            raise UserError(f"--params is not JSON: {exc}") from None
        from chongming_redis.client.client import Client

        task_app = load_app(app_spec)  # a bad APP: nothing opened, no SQLite file created
        store = open_store(redis, namespace, store_url=store_url, create=True,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        buckets = _namespace_buckets(store, namespace, num_buckets)
        client = Client(store, app=task_app, num_buckets=buckets, name=_cli_owner(),
                        owns_store=True)  # fmt: skip
        with progress("submitting", count, shown=None if count > 1 else False) as advance:
            done = 0
            while done < count:  # up to SUBMIT_BATCH per round trip
                batch = [decoded] * min(SUBMIT_BATCH, count - done)
                handles = client.submit_many(name, batch, key=key, tags=tag or (),
                                             delay=delay or None)  # fmt: skip
                sys.stdout.write("".join(f"{h.task_id}\n" for h in handles))
                sys.stdout.flush()
                done += len(handles)
                advance(len(handles))
        client.close()


def _namespace_buckets(store: Any, namespace: str, given: int | None) -> int:
    """The bucket count to submit with: the one the namespace's workers recorded. A different
    ``--num-buckets`` would put tasks in buckets no worker serves: refused."""
    recorded = store.recorded_num_buckets()
    if given is not None and recorded is not None and given != recorded:
        raise UserError(f"namespace {namespace!r} runs with --num-buckets={recorded}, not {given}: "
                        "tasks submitted with another count would never run")  # fmt: skip
    return given or recorded or 64


cli_read.register(app)  # tasks, show, stats, reconcile


@app.command(epilog="Example: chongming-redis changes --after 0 --limit 100 --follow")
def changes(
    after: Annotated[
        str, typer.Option(help="the cursor to read after ('0': from the start)")
    ] = "0",
    limit: Annotated[int, typer.Option(help="items per page, 1..256")] = 256,
    follow: Annotated[bool, typer.Option(help="keep reading until interrupted")] = False,
    interval: Annotated[float, typer.Option(help="seconds between polls when caught up")] = 1.0,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """The change feed as JSON lines: one per item, then {"next_cursor": ...} per page."""
    from chongming_redis.feed.follow import stream

    with user_errors():
        store = open_store(redis, namespace, store_url=store_url,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        try:
            stream(store, after=after, limit=limit, follow=follow, interval=interval,
                   write=lambda line: print(line, flush=True))  # fmt: skip
        except KeyboardInterrupt:
            raise typer.Exit(0) from None


cli_control.register(app)


@app.command(epilog="Example: chongming-redis prune --keep 10000")
def prune(
    keep: Annotated[int, typer.Option(help="terminal tasks to keep (the newest)")] = 1000,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Drop the oldest terminal tasks beyond --keep, with their history."""
    with user_errors():
        if keep < 0:
            raise UserError(f"--keep must be at least 0, not {keep}")
        store = open_store(redis, namespace, store_url=store_url,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        terminal = sum(n for s, n in store.counts().items() if s.is_terminal)
        to_drop = max(0, terminal - keep)
        dropped = 0
        with progress("pruning", to_drop, shown=None if to_drop > PRUNE_STEP else False) as advance:
            # Steps that keep ever fewer: each drops the oldest, as one prune would.
            for target in range(terminal - PRUNE_STEP, keep, -PRUNE_STEP):
                n = store.prune(keep_terminal=target)
                dropped += n
                advance(n)
            n = store.prune(keep_terminal=keep)
            dropped += n
            advance(n)
        console.print(f"pruned {dropped} task(s)", highlight=False)


@app.command()
def demo(
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    tasks_count: Annotated[int, typer.Option("--tasks", help="tasks to submit", min=1)] = 300,
    workers_count: Annotated[int, typer.Option("--workers", help="worker processes", min=1)] = 3,
    keep: Annotated[
        bool, typer.Option("--keep", help="keep the run's tasks in the store given with "
                           "--redis or --store (its namespace, SQLite file or schema)")
    ] = False,
) -> None:  # fmt: skip
    """The multi-process demo, narrated, on a private Redis (or --redis, or --store).

    --store sqlite:///tmp/demo.sqlite3 runs it on a new SQLite file (no Redis at all),
    --store postgresql://... in a new schema of that database.

    Example: chongming-redis demo --tasks 100 --workers 2
    """
    from chongming_redis.demo.run import run_demo

    given = "--store" if store_url else "--redis"
    from_env = bool(redis or store_url) and not any(a.startswith(given) for a in sys.argv[1:])
    with user_errors():
        sys.exit(run_demo(redis_url=redis, store_url=store_url, tasks=tasks_count,
                          workers=workers_count, keep=keep, url_from_env=from_env))  # fmt: skip


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def stress(ctx: typer.Context) -> None:
    """Prove exactly-once on a Redis: a pool under faults, then the checkers (--help)."""
    from chongming_redis.stress.__main__ import main as stress_main

    sys.exit(stress_main(list(ctx.args)))


#: click's exception root, as the installed typer uses it (typer >= 0.24 bundles its own click).
_CLICK_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)

app.command(
    epilog="Example: chongming-redis dashboard --redis redis://127.0.0.1:6379/0 --port 8000 "
    "--allow-control"
)(cli_dashboard.dashboard)


def main() -> None:
    """The entry point: a usage mistake (a bad option value, a missing argument) is one line
    ``error: ...`` and exit status 1, like every other user mistake."""
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        err.print("aborted", highlight=False)
        sys.exit(130)
    except _CLICK_ERROR as exc:
        usage: Any = exc
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain `chongming-redis`: the help
            from typer import rich_utils

            rich_utils.rich_format_error(usage)
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        say_error(usage.format_message() + hint)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
