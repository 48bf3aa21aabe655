"""``chongming-redis worker``: one worker in this process, or N forked worker processes under a
supervising parent (``worker_parent``), with a private Redis when none is given."""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from chongming_redis.cli_common import err, load_app, open_store, user_errors

if TYPE_CHECKING:  # imported by the commands that need it: the CLI starts fast
    from chongming_redis.runtime.config import ControllerConfig

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


def run_worker(options: WorkerOptions) -> None:
    """One worker in this process: join the pool, run until SIGTERM/SIGINT."""
    from chongming_redis.runtime.buckets import BucketPolicy
    from chongming_redis.runtime.controller import Controller

    store = open_store(options.redis, options.namespace)
    owner = f"{os.uname().nodename}-{os.getpid()}"
    controller = Controller(store, app=load_app(options.app_spec), owner=owner,
                            config=options.config,
                            buckets=BucketPolicy(options.num_buckets))  # fmt: skip
    controller.join_pool(worker_lease=options.worker_lease)
    err.print(f"worker {owner}: namespace {options.namespace!r}, "
              f"{options.config.concurrency} slots")  # fmt: skip
    controller.run_forever(grace=options.grace)


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
        err.print(f"started a private Redis ({embedded.origin}) at {options.redis}")

    def child() -> None:
        try:
            with user_errors():
                run_worker(options)
        except typer.Exit as exc:  # a one-line error was printed: exit with its status
            raise SystemExit(exc.exit_code) from None

    try:
        status = supervise_children(child, processes, say=lambda line: err.print(line))
    finally:
        if embedded is not None:
            embedded.stop()
    if status != 0:
        raise typer.Exit(status)
