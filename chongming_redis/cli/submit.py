"""``chongming-redis submit``: submit tasks of an app, printing their ids one per line."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Annotated, Any

import typer

from chongming_redis.cli.common import (
    ClusterOpt,
    DurabilityOpt,
    NamespaceOpt,
    RedisOpt,
    StoreOpt,
    UserError,
    load_app,
    open_store,
    progress,
    user_errors,
)
from chongming_redis.cli.registry import Commands

commands = Commands()
#: ``submit --count``: tasks per round trip (``Controller.submit_many`` batches up to 100).
SUBMIT_BATCH = 100
#: ``submit --delay``: at most about 31 years.
MAX_DELAY = 1e9


def _cli_owner() -> str:
    return f"cli-{os.uname().nodename}-{os.getpid()}"


@commands.command(
    epilog="Example: chongming-redis submit tasks:app resize --params '{\"width\": 640}' "
    "--count 100 --delay 30 --tag batch --priority 5"
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
    priority: Annotated[
        int | None,
        typer.Option(help="-100..100, higher starts first (default: the task type's, else 0)"),
    ] = None,
    unique: Annotated[
        str | None,
        typer.Option(
            help="create it only while no unfinished task holds this id; else print "
            "that task's id (with --count 1)"
        ),
    ] = None,
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
        if priority is not None and not -100 <= priority <= 100:
            raise UserError(f"--priority must be an integer from -100 to 100, not {priority}")
        if unique is not None and count != 1:
            raise UserError(f"--unique submits one task: it cannot go with --count {count}")
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
        if unique is not None:
            _submit_unique(client, name, decoded, key=key, tags=tag or (), delay=delay,
                           priority=priority, unique=unique)  # fmt: skip
            return
        with progress("submitting", count, shown=None if count > 1 else False) as advance:
            done = 0
            while done < count:  # up to SUBMIT_BATCH per round trip
                batch = [decoded] * min(SUBMIT_BATCH, count - done)
                handles = client.submit_many(name, batch, key=key, tags=tag or (),
                                             delay=delay or None, priority=priority)  # fmt: skip
                sys.stdout.write("".join(f"{h.task_id}\n" for h in handles))
                sys.stdout.flush()
                done += len(handles)
                advance(len(handles))
        client.close()


def _submit_unique(client: Any, name: str, params: Any, *, unique: str, **options: Any) -> None:
    """One ``unique`` submit: the new task's id, or the unfinished holder's with a note on
    stderr (exit 0: the job is there, as asked)."""
    try:
        handle = client.submit(name, params, unique=unique, delay=options.pop("delay") or None,
                               **options)  # fmt: skip
    finally:
        client.close()
    sys.stdout.write(f"{handle.task_id}\n")
    if not handle.created:
        sys.stderr.write(f"unique id {unique!r} is held by unfinished task {handle.task_id}: "
                         "nothing submitted\n")  # fmt: skip


def _namespace_buckets(store: Any, namespace: str, given: int | None) -> int:
    """The bucket count to submit with: the one the namespace's workers recorded. A different
    ``--num-buckets`` would put tasks in buckets no worker serves: refused."""
    recorded = store.recorded_num_buckets()
    if given is not None and recorded is not None and given != recorded:
        raise UserError(f"namespace {namespace!r} runs with --num-buckets={recorded}, not {given}: "
                        "tasks submitted with another count would never run")  # fmt: skip
    return given or recorded or 64


register = commands.register
