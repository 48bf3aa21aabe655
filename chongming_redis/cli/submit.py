"""``chongming-redis submit``: submit tasks of an app, printing their ids one per line."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
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
from chongming_redis.errors import ParentNotFound
from chongming_redis.parents import PARENT_FAILURE_POLICIES, STOP, check_parents
from chongming_redis.validation import check_optional_identifier

commands = Commands()
#: ``submit --count``: tasks per round trip (``Controller.submit_many`` batches up to 100).
SUBMIT_BATCH = 100
#: ``submit --delay``: at most about 31 years.
MAX_DELAY = 1e9


def _cli_owner() -> str:
    return f"cli-{os.uname().nodename}-{os.getpid()}"


@commands.command(
    epilog="Example: chongming-redis submit tasks:app resize --params '{\"width\": 640}' "
    "--count 100 --delay 30 --tag batch --priority 5; chongming-redis submit tasks:app merge "
    "--after ID1 --after ID2 --on-parent-failure run"
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
    after: Annotated[
        list[str] | None,
        typer.Option(
            "--after",
            metavar="ID",
            help="repeatable: created waiting, it starts once these tasks have ended "
            "(see --on-parent-failure)",
        ),
    ] = None,
    on_parent_failure: Annotated[
        str | None,
        typer.Option(
            "--on-parent-failure",
            metavar="stop|run",
            help="with --after, a parent that ends other than succeeded: stop ends this task "
            "stopped (the default), run runs it once every parent has ended",
        ),
    ] = None,
    pipeline: Annotated[
        str | None, typer.Option(help="pipeline run id (the dashboard draws its graph)")
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
        parents = _parents(after or (), on_parent_failure)
        if pipeline is not None:
            check_optional_identifier(pipeline, "--pipeline")
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
        dependencies: dict[str, Any] = {"after": parents,
                                        "on_parent_failure": on_parent_failure or STOP,
                                        "pipeline_run_id": pipeline}  # fmt: skip
        try:
            if unique is not None:
                _submit_unique(client, name, decoded, key=key, tags=tag or (), delay=delay,
                               priority=priority, unique=unique, **dependencies)  # fmt: skip
                return
            _submit_batches(client, name, decoded, count, key=key, tags=tag or (),
                            delay=delay or None, priority=priority, **dependencies)  # fmt: skip
        except ParentNotFound as exc:  # the client's message names the id never created
            raise UserError(f"--after {exc.parent}: no such task in namespace {namespace!r} "
                            "(never created, or pruned); nothing submitted") from None  # fmt: skip
        finally:
            client.close()


def _submit_batches(client: Any, name: str, params: Any, count: int, **options: Any) -> None:
    """``count`` tasks, up to ``SUBMIT_BATCH`` per round trip, their ids printed as created."""
    with progress("submitting", count, shown=None if count > 1 else False) as advance:
        done = 0
        while done < count:
            batch = [params] * min(SUBMIT_BATCH, count - done)
            handles = client.submit_many(name, batch, **options)
            sys.stdout.write("".join(f"{h.task_id}\n" for h in handles))
            sys.stdout.flush()
            done += len(handles)
            advance(len(handles))


def _parents(after: Sequence[str], on_parent_failure: str | None) -> tuple[str, ...]:
    """``--after`` as task ids, checked before anything is opened (a missing parent is the
    store's ``ParentNotFound``, a store without dependencies the client's ``TypeError``)."""
    if on_parent_failure is not None and on_parent_failure not in PARENT_FAILURE_POLICIES:
        raise UserError(f"--on-parent-failure must be stop or run, not {on_parent_failure!r}")
    if on_parent_failure is not None and not after:
        raise UserError("--on-parent-failure says what a parent's failure does: it needs "
                        "--after ID")  # fmt: skip
    if len(set(after)) != len(after):
        repeated = next(p for p in after if after.count(p) > 1)
        raise UserError(f"--after names task {repeated!r} more than once")
    try:
        return check_parents(after)
    except (TypeError, ValueError) as exc:
        raise UserError(f"--after: {exc}") from None


def _submit_unique(client: Any, name: str, params: Any, *, unique: str, **options: Any) -> None:
    """One ``unique`` submit: the new task's id, or the unfinished holder's with a note on
    stderr (exit 0: the job is there, as asked)."""
    handle = client.submit(name, params, unique=unique, delay=options.pop("delay") or None,
                           **options)  # fmt: skip
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
