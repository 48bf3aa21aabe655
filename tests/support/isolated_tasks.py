"""Task types that run in child processes (``isolation="process"``): importable by name."""

from __future__ import annotations

import time

from chongming_redis.policy import NonRetryable, RetryPolicy
from chongming_redis.runtime.app import App

app = App("isolated")


@app.task(isolation="process")
def spin_forever(ctx, params):  # type: ignore[no-untyped-def]
    """CPU-bound and never checks in: only a hard stop can end it."""
    while True:
        pass


@app.task(isolation="process")
def count(ctx, params):  # type: ignore[no-untyped-def]
    for i in range(params["n"]):
        ctx.checkpoint(current=i, total=params["n"])
        time.sleep(params.get("sleep", 0.01))
    return {"counted": params["n"]}


@app.task(isolation="process")
def explode(ctx, params):  # type: ignore[no-untyped-def]
    raise RuntimeError("boom in the child")


@app.task("spin_with_timeout", isolation="process", timeout=0.5)
def spin_with_timeout(ctx, params):  # type: ignore[no-untyped-def]
    """Never checks in, with a timeout: the parent's SIGTERM then SIGKILL ends it."""
    while True:
        pass


class Declined(NonRetryable):
    pass


@app.task("connects", isolation="process",
          retry=RetryPolicy(max_attempts=2, base_delay=0.01, retry_on=(OSError,)))  # fmt: skip
def connects(ctx, params):  # type: ignore[no-untyped-def]
    """A ConnectionError in the child is an OSError: retried through the class hierarchy."""
    if ctx.attempt == 1:
        raise ConnectionError("first attempt")
    return {"attempt": ctx.attempt}


@app.task("declines", isolation="process", retry=RetryPolicy(max_attempts=3, base_delay=0.01))
def declines(ctx, params):  # type: ignore[no-untyped-def]
    raise Declined("a subclass of NonRetryable: final at once")
