"""Task types with limits, for the runtime, CLI and dashboard tests of limits
(``tests.support.limits_app:app``), and ``fill``: a store where one key's concurrency limit is
full with a task waiting behind it, made by the store's own start step (no worker running).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import BaseModel

from chongming_redis.limits import Concurrency, RateLimit
from chongming_redis.runtime.app import App
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.context import TaskContext

app = App("limits-test")


class Export(BaseModel):
    customer: str
    n: int = 0


@app.task(limits=[Concurrency(2, per="customer"), RateLimit(100, per=1.0, name="payments")])
def export(ctx: TaskContext, params: Export) -> int:
    return params.n


@app.task(limits=[RateLimit(100, per=1.0, name="payments")])
def charge(ctx: TaskContext, params: dict[str, Any]) -> None:
    return None


#: The refs of an ``export`` of customer ``c``.
def export_refs(customer: str) -> tuple[str, ...]:
    return (f"export.concurrency={customer}", "payments")


def fill(store: Any) -> dict[str, list[str]]:
    """Record ``app``'s limits, submit 3 exports of ``acme`` and 1 of ``zeta``, and start what
    the limits allow: acme's two RUNNING (its ref full), its third PENDING and waiting, zeta's
    RUNNING. Returns the task ids per customer."""
    from chongming_redis.client.client import Client

    definitions, task_limits = app.limit_definitions()
    store.record_limits(definitions, task_limits)
    client = Client(store, app=app, num_buckets=BucketPolicy().num_buckets)
    ids: dict[str, list[str]] = {"acme": [], "zeta": []}
    for customer in ("acme", "acme", "acme", "zeta"):
        ids[customer].append(client.submit("export", {"customer": customer}).task_id)
    now, every = datetime.now(timezone.utc), list(range(BucketPolicy().num_buckets))
    started = store.start_tasks(owner="w1", now=now, lease_until=now + timedelta(minutes=5),
                                buckets=every, limit=50)  # fmt: skip
    # Which two of acme's start is the store's start order (its clock), not the submit order.
    assert sorted(t.params["customer"] for t in started) == ["acme", "acme", "zeta"], started
    return ids
