"""Differential stateful test: ``SqliteTaskStore`` against the reference ``InMemoryTaskStore``,
with the machine of ``tests/test_redis_stateful.py`` (random sequences of all 14 protocol
operations on both stores at once, every answer and every invariant compared strictly, then
both closed and refusing every method), on a new database file per example.

Each example also shrinks the store's ``prune`` batch (``SqlTaskStore.prune_batch``) to one or
two tasks, so the batch loop of ``prune`` runs, not only the single-batch case.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from tests.test_redis_stateful import _run

pytestmark = pytest.mark.slow

_BATCHES = (1, 2, SqliteTaskStore.prune_batch)


def test_sqlite_store_matches_the_reference_on_random_operation_sequences(
    tmp_path: Path,
) -> None:
    made = 0

    def factory() -> TaskStore:
        nonlocal made
        store = SqliteTaskStore(tmp_path / f"example-{made}.sqlite3")
        store.prune_batch = _BATCHES[made % len(_BATCHES)]
        made += 1
        return store

    _run(factory, max_examples=100, check_reach=True)
