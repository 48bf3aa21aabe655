"""Differential stateful test of the SQL stores: ``SqliteTaskStore`` (a new database file per
example) and ``PostgresTaskStore`` (a new schema per example on the session's PostgreSQL)
against the reference ``InMemoryTaskStore``, with the machine of ``tests/test_redis_stateful.py``
(random sequences of all 14 protocol operations on both stores at once, every answer and every
invariant compared strictly, then both closed and refusing every method).

Each example also shrinks the store's ``prune`` batch (``SqlTaskStore.prune_batch``) to one or
two tasks, so the batch loop of ``prune`` runs, not only the single-batch case.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.stores._sql.store import SqlTaskStore
from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from tests.test_redis_stateful import _run

pytestmark = pytest.mark.slow

_BATCHES = (1, 2, SqlTaskStore.prune_batch)


def shrinking(open_store: Callable[[int], SqlTaskStore]) -> Callable[[], TaskStore]:
    """A factory of fresh stores (``open_store(n)`` for the n-th example), each with the next
    ``prune`` batch of ``_BATCHES``."""
    made = 0

    def factory() -> TaskStore:
        nonlocal made
        store = open_store(made)
        store.prune_batch = _BATCHES[made % len(_BATCHES)]
        made += 1
        return store

    return factory


def test_sqlite_store_matches_the_reference_on_random_operation_sequences(
    tmp_path: Path,
) -> None:
    factory = shrinking(lambda n: SqliteTaskStore(tmp_path / f"example-{n}.sqlite3"))
    _run(factory, max_examples=40, check_reach=True, cap=120)


def test_postgres_store_matches_the_reference_on_random_operation_sequences(
    postgres_proc: PostgresProc,
) -> None:
    def open_store(n: int) -> SqlTaskStore:
        return PostgresTaskStore(postgres_proc.dsn, schema=f"sm_{uuid.uuid4().hex[:12]}")

    # Rounds of more examples until the reach floor (MUST_SEE) is met: it missed one outcome
    # in one run of 80.
    _run(shrinking(open_store), max_examples=40, check_reach=True, cap=140)
