"""The store a stress run drives and reads back: what the driver, the feed watch and the report
use of it. Every built-in store has it all (Redis, the cluster, SQLite, PostgreSQL)."""

from __future__ import annotations

from typing import Protocol

from chongming_redis.stores.extensions import ServerClockStore, TaskPoliciesStore
from chongming_redis.stores.protocol import ChangeFeed, TaskStore
from chongming_redis.stores.schedule_store import SchedulesStore


class StressStore(TaskStore, ChangeFeed, ServerClockStore, TaskPoliciesStore, SchedulesStore,
                  Protocol):  # fmt: skip
    """What the driver and the report use of the store: every built-in store has it all."""
