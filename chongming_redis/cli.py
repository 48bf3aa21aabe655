"""The ``chongming-redis`` command line.

Every command takes ``--redis URL`` (or ``CHONGMING_REDIS_URL``) and ``--namespace``. A user
mistake (unknown task, bad URL, Redis down, bad JSON) prints one line and exits 1, no traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar

import typer

from chongming_redis.cli_common import (
    BucketsOpt,
    NamespaceOpt,
    RedisOpt,
    UserError,
    console,
    load_app,
    open_store,
    user_errors,
)
from chongming_redis.cli_worker import WorkerOptions, run_worker, run_workers
from chongming_redis.model import TaskQuery, TaskStatus

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
T = TypeVar("T")


def client(redis_url: str | None, namespace: str, app_spec: str | None = None) -> Any:
    from chongming_redis.runtime.controller import Controller

    store = open_store(redis_url, namespace)
    return Controller(store, app=load_app(app_spec) if app_spec else None, owner=_cli_owner())


def _cli_owner() -> str:
    return f"cli-{os.uname().nodename}-{os.getpid()}"


# -- commands ----------------------------------------------------------------------------------


@app.command()
def worker(
    app_spec: Annotated[str, typer.Argument(metavar="APP", help="package.module:app")],
    redis: RedisOpt = None,
    namespace: NamespaceOpt = "default",
    concurrency: Annotated[int, typer.Option(help="tasks run at once per process")] = 4,
    prefetch: Annotated[
        int, typer.Option(help="at most this many started tasks wait for a slot (0: none)")
    ] = 64,
    processes: Annotated[int, typer.Option(help="worker processes to start")] = 1,
    num_buckets: BucketsOpt = 64,
    task_lease: Annotated[float, typer.Option(help="seconds")] = 30.0,
    worker_lease: Annotated[float, typer.Option(help="seconds")] = 5.0,
    grace: Annotated[float, typer.Option(help="shutdown grace, seconds")] = 30.0,
) -> None:
    """Run tasks of APP: join the namespace's pool and serve a share of its buckets."""
    with user_errors():
        from chongming_redis.runtime.config import ControllerConfig

        load_app(app_spec)
        config = ControllerConfig(
            concurrency=concurrency, prefetch=prefetch, task_lease=task_lease,
            reconcile_interval=max(0.5, min(5.0, task_lease / 2)),
            command_poll_interval=0.5, start_poll_interval=1.0,
        )  # fmt: skip
        options = WorkerOptions(app_spec, redis, namespace, config, num_buckets,
                                worker_lease, grace)  # fmt: skip
        if processes > 1 or not redis:
            run_workers(options, processes)
        else:
            run_worker(options)


@app.command()
def submit(
    app_spec: Annotated[str, typer.Argument(metavar="APP")],
    name: Annotated[str, typer.Argument(help="task type")],
    params: Annotated[str, typer.Option(help="JSON parameters")] = "null",
    key: Annotated[str | None, typer.Option(help="bucket key (default: task id)")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="repeatable")] = None,
    count: Annotated[int, typer.Option(help="submit this many")] = 1,
    redis: RedisOpt = None,
    namespace: NamespaceOpt = "default",
    num_buckets: Annotated[
        int | None,
        typer.Option("--num-buckets", help="the namespace's bucket count (default: recorded)"),
    ] = None,
) -> None:
    """Submit tasks; prints their ids."""
    with user_errors():
        if count < 1:
            raise UserError(f"--count must be at least 1, not {count}")
        try:
            decoded = json.loads(params)
        except json.JSONDecodeError as exc:
            raise UserError(f"--params is not JSON: {exc}") from None
        from chongming_redis.runtime.buckets import BucketPolicy
        from chongming_redis.runtime.controller import Controller

        store = open_store(redis, namespace)
        buckets = _namespace_buckets(store, namespace, num_buckets)
        controller = Controller(store, app=load_app(app_spec), owner=_cli_owner(),
                                buckets=BucketPolicy(buckets))  # fmt: skip
        for _ in range(count):
            console.print(controller.submit(name, decoded, key=key, tags=tag or ()))


def _namespace_buckets(store: Any, namespace: str, given: int | None) -> int:
    """The bucket count to submit with: the one the namespace's workers recorded. A different
    ``--num-buckets`` would put tasks in buckets no worker serves: refused."""
    raw = store.client.hget(store.keys.meta, "num_buckets")
    recorded = None if raw is None else int(raw)
    if given is not None and recorded is not None and given != recorded:
        raise UserError(f"namespace {namespace!r} runs with --num-buckets={recorded}, not {given}: "
                        "tasks submitted with another count would never run")  # fmt: skip
    return given or recorded or 64


@app.command()
def tasks(
    status: Annotated[list[str] | None, typer.Option(help="repeatable")] = None,
    name: str | None = None,
    name_prefix: str | None = None,
    tag: str | None = None,
    bucket: Annotated[list[int] | None, typer.Option(help="repeatable")] = None,
    pipeline: str | None = None,
    limit: int = 50,
    newest_first: bool = False,
    redis: RedisOpt = None,
    namespace: NamespaceOpt = "default",
) -> None:
    """List tasks (filters of TaskQuery)."""
    from rich.table import Table  # only the commands that print tables load it

    with user_errors():
        statuses = None if not status else frozenset(_status(s) for s in status)
        query = TaskQuery(
            statuses=statuses, name=name, name_prefix=name_prefix, tag=tag, limit=limit,
            buckets=frozenset(bucket) if bucket else None, pipeline_run_id=pipeline,
            newest_first=newest_first,
        )  # fmt: skip
        found = open_store(redis, namespace).query(query)
        table = Table(title=f"{len(found)} task(s)")
        for column in ("id", "name", "status", "v", "bucket", "attempt", "created", "owner"):
            table.add_column(column)
        for t in found:
            table.add_row(
                t.task_id, t.name, t.status.value, str(t.status_version), str(t.bucket),
                str(t.attempt), f"{t.created_at:%H:%M:%S}", t.lease_owner or "",
            )  # fmt: skip
        console.print(table)


@app.command()
def show(
    task_id: str,
    redis: RedisOpt = None,
    namespace: NamespaceOpt = "default",
) -> None:
    """One task: its snapshot and its history."""
    from rich.table import Table  # only the commands that print tables load it

    with user_errors():
        store = open_store(redis, namespace)
        snapshot = store.get(task_id)
        if snapshot is None:
            raise UserError(f"no task {task_id!r} in namespace {namespace!r}")
        table = Table(title=f"task {task_id}", show_header=False)
        for field, value in vars(snapshot).items():
            table.add_row(field, repr(value) if value is not None else "")
        console.print(table)
        history = Table(title="history")
        for column in ("v", "from", "to", "at", "reason"):
            history.add_column(column)
        for entry in store.history(task_id):
            history.add_row(str(entry.version), str(entry.from_status or ""), str(entry.to_status),
                            entry.at.isoformat(), entry.reason or "")  # fmt: skip
        console.print(history)


@app.command()
def changes(
    after: Annotated[
        str, typer.Option(help="the cursor to read after ('0': from the start)")
    ] = "0",
    limit: Annotated[int, typer.Option(help="items per page, 1..256")] = 256,
    follow: Annotated[bool, typer.Option(help="keep reading until interrupted")] = False,
    interval: Annotated[float, typer.Option(help="seconds between polls when caught up")] = 1.0,
    redis: RedisOpt = None,
    namespace: NamespaceOpt = "default",
) -> None:
    """The change feed as JSON lines: one per item, then {"next_cursor": ...} per page."""
    from chongming_redis.feed.follow import stream

    with user_errors():
        store = open_store(redis, namespace)
        try:
            stream(store, after=after, limit=limit, follow=follow, interval=interval,
                   write=lambda line: print(line, flush=True))  # fmt: skip
        except KeyboardInterrupt:
            raise typer.Exit(0) from None


def _control(action: str) -> Callable[..., None]:
    def command(task_id: str, redis: RedisOpt = None, namespace: NamespaceOpt = "default") -> None:
        with user_errors():
            console.print(getattr(client(redis, namespace), action)(task_id))

    command.__doc__ = f"{action.capitalize()} a task (through its holder, wherever it runs)."
    command.__name__ = action
    return command


for _action in ("stop", "pause", "resume"):
    app.command(name=_action)(_control(_action))


@app.command()
def stats(redis: RedisOpt = None, namespace: NamespaceOpt = "default") -> None:
    """Counts per status and per bucket, live workers and their buckets."""
    from rich.table import Table  # only the commands that print tables load it

    with user_errors():
        store = open_store(redis, namespace)
        counts = {s.value: n for s, n in store.counts().items()}
        console.print(counts)
        per_bucket = store.bucket_counts()
        table = Table(title="per bucket (non-zero)")
        table.add_column("bucket")
        for s in TaskStatus:
            table.add_column(s.value)
        for b in sorted(per_bucket):
            table.add_row(str(b), *(str(per_bucket[b][s]) for s in TaskStatus))
        console.print(table)
        workers, owners = store.pool_state()
        now = datetime.now(timezone.utc)
        wt = Table(title="workers")
        for column in ("worker", "heartbeat valid for", "buckets"):
            wt.add_column(column)
        for w, until in sorted(workers.items()):
            mine = sorted(b for b, o in owners.items() if o == w)
            wt.add_row(w, f"{(until - now).total_seconds():.1f}s", f"{len(mine)}: {mine}")
        console.print(wt)


@app.command()
def reconcile(redis: RedisOpt = None, namespace: NamespaceOpt = "default") -> None:
    """Mark tasks whose lease expired LOST (and queue retries) once."""
    with user_errors():
        report = client(redis, namespace).reconcile()
        console.print({"lost": report.lost, "retried": report.retried, "stalled": report.stalled})


@app.command()
def prune(
    keep: Annotated[int, typer.Option(help="terminal tasks to keep")] = 1000,
    redis: RedisOpt = None,
    namespace: NamespaceOpt = "default",
) -> None:
    """Drop the oldest terminal tasks beyond --keep, with their history."""
    with user_errors():
        console.print(f"pruned {open_store(redis, namespace).prune(keep_terminal=keep)} task(s)")


@app.command()
def demo(
    redis: RedisOpt = None,
    tasks_count: Annotated[int, typer.Option("--tasks")] = 300,
    workers_count: Annotated[int, typer.Option("--workers")] = 3,
) -> None:
    """The multi-process demo on a private Redis (or --redis)."""
    from chongming_redis.demo import run_demo

    with user_errors():
        sys.exit(run_demo(redis_url=redis, tasks=tasks_count, workers=workers_count))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def stress(ctx: typer.Context) -> None:
    """Prove exactly-once on a Redis: a pool under faults, then the checkers (--help)."""
    from chongming_redis.stress.__main__ import main as stress_main

    sys.exit(stress_main(list(ctx.args)))


def _status(text: str) -> TaskStatus:
    try:
        return TaskStatus(text.lower())
    except ValueError:
        known = ", ".join(s.value for s in TaskStatus)
        raise UserError(f"unknown status {text!r} (one of: {known})") from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
