"""``chongming-redis demo`` (the narrated multi-process demo) and ``chongming-redis stress``
(the fault-injected proof of exactly-once): each imports its engine only when it runs."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from chongming_redis.cli.common import RedisOpt, StoreOpt, user_errors
from chongming_redis.cli.registry import Commands

commands = Commands()


@commands.command()
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


@commands.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def stress(ctx: typer.Context) -> None:
    """Prove exactly-once on a Redis: a pool under faults, then the checkers (--help)."""
    from chongming_redis.stress.__main__ import main as stress_main

    sys.exit(stress_main(list(ctx.args)))


register = commands.register
