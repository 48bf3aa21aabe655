"""The read commands: ``tasks``, ``show``, ``stats``, ``limits``, ``reconcile`` (which also
writes, and reports what it did) and ``changes`` (the change feed as JSON lines). Tables for
people (``cli/render.py``), ``--json`` for scripts (``cli/json_output.py`` documents the keys);
a namespace with no tasks says so instead of printing an empty table. They do not check the
server's durability settings: that warning belongs to the commands that write, not to every
look.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Annotated, Any

import typer

from chongming_redis.cli.common import (
    ClusterOpt,
    DurabilityOpt,
    JsonOpt,
    MaxAttemptsOpt,
    NamespaceOpt,
    RedisOpt,
    RetryBackoffOpt,
    StoreOpt,
    UserError,
    WideOpt,
    console,
    open_store,
    out,
    print_json,
    retry_policy,
    user_errors,
    where,
)
from chongming_redis.cli.registry import Commands
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus

STATUSES = ", ".join(s.value for s in TaskStatus)
commands = Commands()


@commands.command(
    epilog="Example: chongming-redis tasks --status running --status paused --newest-first "
    "--limit 20; chongming-redis tasks --status waiting --pipeline wf-1a2b; "
    "chongming-redis tasks --json | jq -r '.tasks[].task_id'"
)
def tasks(
    status: Annotated[
        list[str] | None, typer.Option(help=f"repeatable; one of: {STATUSES}")
    ] = None,
    name: Annotated[str | None, typer.Option(help="task type")] = None,
    name_prefix: Annotated[str | None, typer.Option(help="task types starting with this")] = None,
    tag: str | None = None,
    bucket: Annotated[list[int] | None, typer.Option(help="repeatable")] = None,
    pipeline: Annotated[str | None, typer.Option(help="pipeline run id")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    newest_first: Annotated[
        bool, typer.Option("--newest-first", help="newest first (default: oldest first)")
    ] = False,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """List tasks: id, name, status, progress, attempt, bucket, created, holder."""
    with user_errors():
        statuses = None if not status else frozenset(_status(s) for s in status)
        if limit < 1:
            raise UserError(f"--limit must be at least 1, not {limit}")
        query = TaskQuery(
            statuses=statuses, name=name, name_prefix=name_prefix, tag=tag, limit=limit,
            buckets=frozenset(bucket) if bucket else None, pipeline_run_id=pipeline,
            newest_first=newest_first,
        )  # fmt: skip
        store = open_store(redis, namespace, store_url=store_url, check_server=False,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        found = store.query(query)
        if as_json:
            from chongming_redis.cli.json_output import task_json

            print_json({"namespace": namespace, "tasks": [task_json(t) for t in found]})
            return
        if not found:
            empty = sum(store.counts().values()) == 0
            console.print(f"{where(namespace, redis or store_url)} has no tasks" if empty
                          else "no tasks match", highlight=False, soft_wrap=True)  # fmt: skip
            return
        from chongming_redis.cli.render import tasks_table

        order = "newest" if newest_first else "oldest"
        more = f", the {order} {limit} (--limit)" if len(found) == limit else f", {order} first"
        out(wide=wide).print(tasks_table(found, title=f"{len(found)} task(s){more}",
                                         now=datetime.now(timezone.utc)))  # fmt: skip


@commands.command(epilog="Example: chongming-redis show 3f2a9c0d41e5b6a7c8d9 --json")
def show(
    task_id: str,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """One task: its fields, its failure's traceback, and its history as a timeline."""
    with user_errors():
        store = open_store(redis, namespace, store_url=store_url, check_server=False,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        snapshot = store.get(task_id)
        if snapshot is None:
            empty = sum(store.counts().values()) == 0
            hint = f" ({where(namespace, redis or store_url)} has no tasks)" if empty else ""
            raise UserError(f"no task {task_id!r} in namespace {namespace!r}{hint}")
        history = store.history(task_id)
        parents = _parent_statuses(store, snapshot)
        if as_json:
            from chongming_redis.cli.json_output import show_json

            print_json(show_json(namespace, snapshot, history, parents))
            return
        from chongming_redis.cli.render import show_task

        show_task(out(wide=wide), snapshot, history, datetime.now(timezone.utc), parents)


#: ``show`` reads the status of this many of a task's parents (the rest are counted).
SHOWN_PARENTS = 20


def _parent_statuses(store: Any, snapshot: TaskSnapshot) -> dict[str, TaskStatus | None]:
    """The statuses of the task's first ``SHOWN_PARENTS`` parents (``None``: pruned)."""
    found = {}
    for parent in snapshot.parents[:SHOWN_PARENTS]:
        task = store.get(parent)
        found[parent] = None if task is None else task.status
    return found


@commands.command(epilog="Example: chongming-redis stats --namespace thumbnails --json")
def stats(
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Counts per status and per bucket, the workers and their buckets."""
    with user_errors():
        store = open_store(redis, namespace, store_url=store_url, check_server=False,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        from chongming_redis.runtime.stranded import describe, stranded_types

        counts = store.counts()
        per_bucket = store.bucket_counts()
        workers, owners = store.pool_state()
        now = datetime.now(timezone.utc)
        stranded = stranded_types(store, now) if counts.get(TaskStatus.PENDING) else []
        expired, next_expiry = store.expiry_backlog(now=now)
        if as_json:
            from chongming_redis.cli.json_output import stats_json

            doc = stats_json(namespace, counts, per_bucket, workers, owners, now)
            doc["stranded"] = [{"name": s.name, "waiting": s.waiting,
                                "longest_seconds": round(s.longest.total_seconds(), 3)}
                               for s in stranded]  # fmt: skip
            doc["retention"] = {"expired_not_yet_removed": expired,
                                "next_expiry": None if next_expiry is None
                                else next_expiry.isoformat()}  # fmt: skip
            print_json(doc)
            return
        from chongming_redis.cli.render import buckets_table, counts_table, workers_table

        screen = out(wide=wide)
        if sum(counts.values()) == 0:
            screen.print(f"{where(namespace, redis or store_url)} has no tasks", highlight=False)
        else:
            screen.print(counts_table(counts))
            screen.print(buckets_table(per_bucket))
        if workers:
            screen.print(workers_table(workers, owners, now))
        else:
            screen.print("no workers have joined this namespace", highlight=False)
        finished = sum(n for status, n in counts.items() if status.is_terminal)
        if finished:  # what retention will remove, and when the next one goes
            when = "none kept expires" if next_expiry is None else f"next expiry {next_expiry}"
            screen.print(f"finished tasks: {finished} kept; {expired} past their retention, "
                         f"removed by the workers; {when}", highlight=False)  # fmt: skip
        for one in stranded:
            screen.print(f"warning: {describe(one)}", style="yellow", highlight=False)


@commands.command(epilog="Example: chongming-redis limits --busiest 10 --json")
def limits(
    busiest: Annotated[int, typer.Option(help="the busiest keys shown per limit")] = 5,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Each limit the workers recorded: its definition, tasks holding it and waiting on it,
    and its busiest keys."""
    from chongming_redis.runtime.limit_defs import USAGE_READ, limit_rows
    from chongming_redis.stores.extensions import LimitsStore

    with user_errors():
        if busiest < 0:
            raise UserError(f"--busiest must be at least 0, not {busiest}")
        store = open_store(redis, namespace, store_url=store_url, check_server=False,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        if not isinstance(store, LimitsStore):
            raise UserError(f"{type(store).__name__} does not record limits (it is no "
                            "LimitsStore)")  # fmt: skip
        definitions, task_limits = store.limit_definitions()
        rows = limit_rows(definitions, store.limit_usage(limit=USAGE_READ), busiest=busiest)
        if as_json:
            from chongming_redis.cli.json_output import limits_json

            print_json(limits_json(namespace, rows, task_limits))
            return
        if not rows:
            console.print(f"{where(namespace, redis or store_url)} has no limits recorded "
                          "(a worker records its app's when it starts)", highlight=False,
                          soft_wrap=True)  # fmt: skip
            return
        from chongming_redis.cli.render import limits_table

        out(wide=wide).print(limits_table(rows, task_limits))


@commands.command(epilog="Example: chongming-redis reconcile --json")
def reconcile(
    max_attempts: MaxAttemptsOpt = 3,
    retry_backoff: RetryBackoffOpt = 1.0,
    as_json: JsonOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Mark tasks whose lease expired LOST (and queue retries) once; say what was done.

    Give it the workers' --max-attempts/--retry-backoff: a lost task is retried as they would.
    """
    from chongming_redis.runtime.controller import Controller

    with user_errors():
        retry = retry_policy(max_attempts, retry_backoff)
        store = open_store(redis, namespace, store_url=store_url,
                           durability_replicas=durability_replicas, cluster=cluster)  # fmt: skip
        report = Controller(store, owner=_cli_owner(), retry=retry).reconcile()
        if as_json:
            from chongming_redis.cli.json_output import reconcile_json

            print_json(reconcile_json(namespace, report.lost, report.retried, report.stalled))
            return
        from chongming_redis.cli.render import reconcile_lines

        console.print(reconcile_lines(report.lost, report.retried, report.stalled))


def _status(text: str) -> TaskStatus:
    try:
        return TaskStatus(text.lower())
    except ValueError:
        raise UserError(f"unknown status {text!r} (one of: {STATUSES})") from None


def _cli_owner() -> str:
    return f"cli-{os.uname().nodename}-{os.getpid()}"


@commands.command(epilog="Example: chongming-redis changes --after 0 --limit 100 --follow")
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


register = commands.register
