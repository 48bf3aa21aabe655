"""A PostgreSQL client stalled in the middle of a write (SIGSTOPped, frozen, swapped out) must not
stop every other writer of the schema: each write locks the feed's head row, so without a limit
the others wait behind the stalled one for as long as it stays stopped. Found by the stress run
on PostgreSQL (``chongming-redis stress --store postgresql``): a worker SIGSTOPped for 6 s held
every write of the pool for 6 s, and a timed-out task was ended 4 s past the run's bound. The
store's connections set ``idle_in_transaction_session_timeout`` (``IDLE_IN_TRANSACTION``), so the
server ends the stalled session and rolls it back."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime

from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.errors import StoreError, StoreUnavailable
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.postgres import PostgresTaskStore

#: How long the stalled client waits for the other writer before it gives up (far longer than
#: the store's idle limit; without the limit the other writer waits exactly this long).
STALL_SECONDS = 30.0


def _pending(task_id: str) -> TaskSnapshot:
    now = datetime.now(UTC)
    return TaskSnapshot(task_id=task_id, name="job", status=TaskStatus.PENDING, status_version=1,
                        created_at=now, updated_at=now)  # fmt: skip


def test_a_client_stalled_mid_write_does_not_stop_the_other_writers(
    postgres_proc: PostgresProc,
) -> None:
    schema = f"stalled-{os.getpid()}"
    stalled = PostgresTaskStore(postgres_proc.dsn, schema=schema)
    writer = PostgresTaskStore(postgres_proc.dsn, schema=schema)
    locked, written = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def stall() -> None:
        try:
            with stalled._transaction(write=True) as tx:
                # What every write does first; then silence, as a SIGSTOPped process keeps.
                tx.rows("SELECT value FROM meta WHERE name = ? FOR UPDATE", ["feed_head"])
                locked.set()
                outcome["written_while_stalled"] = written.wait(STALL_SECONDS)
        except StoreError as exc:
            outcome["stalled_call"] = exc

    holder = threading.Thread(target=stall)
    holder.start()
    try:
        assert locked.wait(30)
        writer.create(_pending("t1"))  # waits until the server ends the stalled session
        written.set()
        holder.join(STALL_SECONDS + 30)
        assert outcome.get("written_while_stalled") is True, outcome
        # the stalled client's transaction was rolled back: its call says nothing was written
        assert isinstance(outcome.get("stalled_call"), StoreUnavailable), outcome
        assert writer.get("t1") is not None
        stalled.create(_pending("t2"))  # and it writes again on a new connection
    finally:
        written.set()
        holder.join(STALL_SECONDS + 30)
        writer.drop_schema()
        writer.close()
        stalled.close()
