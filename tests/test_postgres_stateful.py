"""Differential stateful test: ``PostgresTaskStore`` against the reference ``InMemoryTaskStore``,
with the machine of ``tests/test_redis_stateful.py`` (random sequences of all 14 protocol
operations on both stores at once, every answer and every invariant compared strictly, then
both closed and refusing every method), on a real PostgreSQL: a fresh schema per example on the
session's server.

The machine also shrinks each example's ``prune`` batch (``SqlTaskStore.prune_batch``) to one or
two tasks, so the batch loop of ``prune`` runs, not only the single-batch case.
"""

from __future__ import annotations

import uuid

import pytest

from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.protocol import TaskStore
from tests.support.postgres_server import PostgresProc
from tests.test_redis_stateful import _run

pytestmark = pytest.mark.slow

_BATCHES = (1, 2, PostgresTaskStore.prune_batch)


def test_postgres_store_matches_the_reference_on_random_operation_sequences(
    postgres_proc: PostgresProc,
) -> None:
    made = 0

    def factory() -> TaskStore:
        nonlocal made
        store = PostgresTaskStore(postgres_proc.dsn, schema=f"sm_{uuid.uuid4().hex[:12]}")
        store.prune_batch = _BATCHES[made % len(_BATCHES)]
        made += 1
        return store

    _run(factory, max_examples=80, check_reach=True)
