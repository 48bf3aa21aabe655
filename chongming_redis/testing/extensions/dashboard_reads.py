"""The contract of what a dashboard reads of the commands and the pool
(``CommandInspectingStore``, ``WorkerBeatsStore``): mixed into ``ExtensionsContract``. Each
test returns at once when the store does not implement the extension it checks.

The tests follow each reading through the writes that move it (submit, claim, complete,
release, a lease running out, prune; a worker joining, ticking, leaving, expiring) rather
than checking one fresh value.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from chongming_redis.errors import CommandAlreadyExists, StoreClosed, StoreError
from chongming_redis.model import Command, CommandBacklog, CommandKind
from chongming_redis.stores.extensions import (
    BucketPoolStore,
    CommandInspectingStore,
    CommandReadingStore,
    WorkerBeatsStore,
)
from chongming_redis.testing.contract.support import (
    PENDING,
    SUCCEEDED,
    T0,
    ContractBase,
    at,
    command,
    raises,
    snapshot,
)


def backlog(unclaimed: int, leased: int, oldest: float | None) -> CommandBacklog:
    return CommandBacklog(unclaimed, leased, None if oldest is None else at(oldest))


class DashboardReadsContract(ContractBase):
    def inspecting(self) -> CommandInspectingStore | None:
        return self.store if isinstance(self.store, CommandInspectingStore) else None

    def submit(self, *commands: Command) -> None:
        for item in commands:
            self.store.submit_command(item)

    # -- CommandInspectingStore.task_commands -------------------------------------------------

    def test_task_commands_lists_exactly_the_tasks_commands_oldest_first(self) -> None:
        if (store := self.inspecting()) is None:
            return
        assert store.task_commands("t1") == []  # unknown: nothing, not an error
        self.put(snapshot("t1"), snapshot("t10"), snapshot("t"), snapshot("T1"))
        assert store.task_commands("t1") == []  # a task without commands
        late = command("c-a", created=2, task_id="t1", issued_by="ops", payload={"why": [1]})
        tie_c = command("c-c", created=1, task_id="t1", kind=CommandKind.PAUSE)
        tie_b = command("c-b", created=1, task_id="t1", kind=CommandKind.RESUME)
        other = command("c-0", created=0, task_id="t10")
        short = command("c-1", created=5, task_id="t")
        self.submit(late, tie_c, other, tie_b, short)  # submitted out of order
        assert store.task_commands("t1") == [tie_b, tie_c, late]  # ties by command id
        assert store.task_commands("t10") == [other]  # never a prefix match
        assert store.task_commands("t") == [short]
        assert store.task_commands("T1") == [] and store.task_commands("t1 ") == []
        assert store.task_commands("t1", limit=1000) == [tie_b, tie_c, late]
        assert store.task_commands("t1") == [tie_b, tie_c, late]  # reading changes nothing
        assert self.claimed(9, limit=10) == ["c-0", "c-b", "c-c", "c-a", "c-1"]  # no lease taken

    def test_task_commands_keeps_the_newest_limit_and_shows_leases_and_outcomes(self) -> None:
        if (store := self.inspecting()) is None:
            return
        self.put(snapshot("t1"))
        made = [command(f"c{i:03d}", created=i // 2, task_id="t1") for i in range(103)]
        self.submit(*reversed(made))
        assert store.task_commands("t1") == made[-100:]  # the default limit is 100
        assert store.task_commands("t1", limit=2) == made[-2:]  # c100 | c101: a cut in a tie
        assert store.task_commands("t1", limit=1) == made[-1:]
        assert store.task_commands("t1", limit=3) == made[-3:]
        assert store.task_commands("t1", limit=103) == made
        (claimed,) = self.store.claim_commands(now=at(200), lease_seconds=30, limit=1)
        assert claimed.command_id == "c000"
        self.store.complete_command("c102", now=at(201), outcome="stopped")
        self.store.claim_commands(now=at(202), lease_seconds=5, limit=1)
        self.store.complete_command("c001", now=at(203))  # no outcome; the lease stays
        listed = store.task_commands("t1", limit=1000)
        assert listed[0] == replace(made[0], lease_until=at(230))
        assert listed[1] == replace(made[1], lease_until=at(207), finished_at=at(203))
        assert listed[-1] == replace(made[-1], finished_at=at(201), outcome="stopped")
        assert listed[2:-1] == made[2:-1]
        if isinstance(self.store, CommandReadingStore):
            reader = self.store
            assert listed == [reader.get_command(c.command_id) for c in made]

    def test_task_commands_of_a_pruned_task_are_gone_and_its_id_starts_afresh(self) -> None:
        if (store := self.inspecting()) is None:
            return
        self.put(snapshot("old", status=SUCCEEDED), snapshot("kept", status=SUCCEEDED, created=1),
                 snapshot("live", status=PENDING))  # fmt: skip
        old, kept = command("c1", task_id="old"), command("c2", task_id="kept", created=1)
        live = command("c3", task_id="live", created=2)
        self.submit(old, kept, live)
        assert self.store.prune(keep_terminal=1) == 1  # "old" goes; "kept" is the newest
        assert store.task_commands("old") == []
        assert store.task_commands("kept") == [kept] and store.task_commands("live") == [live]
        self.put(snapshot("old"))  # the same id, a new task: it starts with no commands
        assert store.task_commands("old") == []
        again = command("c4", task_id="old", created=3)
        self.submit(again)
        assert store.task_commands("old") == [again]
        assert self.store.prune(keep_terminal=0) == 1
        assert store.task_commands("kept") == [] and store.task_commands("live") == [live]

    def test_a_refused_submit_lists_nothing_and_a_command_is_listed_once(self) -> None:
        if (store := self.inspecting()) is None:
            return
        self.put(snapshot("t1"), snapshot("t2"))
        first = command("c1", task_id="t1")
        self.submit(first)
        raises(CommandAlreadyExists, self.store.submit_command, first)
        raises(CommandAlreadyExists, self.store.submit_command, command("c1", task_id="t2"))
        raises(TypeError, self.store.submit_command, "c2")
        assert store.task_commands("t1") == [first] and store.task_commands("t2") == []
        done = command("c2", task_id="t2", created=1, finished_at=at(1), outcome="done")
        self.submit(done)  # a command may arrive finished: it is listed as stored
        assert store.task_commands("t2") == [done]

    def test_task_commands_refuses_bad_arguments_before_the_backend(self) -> None:
        if (store := self.inspecting()) is None:
            return

        def refused() -> None:
            raises(ValueError, store.task_commands, "t1", limit=0)
            raises(ValueError, store.task_commands, "t1", limit=1001)
            raises(ValueError, store.task_commands, "t1", limit=-1)
            raises(TypeError, store.task_commands, "t1", limit="5")
            raises(TypeError, store.task_commands, "t1", limit=True)
            raises(TypeError, store.task_commands, "t1", limit=2.0)
            raises(ValueError, store.task_commands, "")
            raises(TypeError, store.task_commands, 7)

        refused()
        self.close_store()
        refused()
        raises(StoreClosed, store.task_commands, "t1")

    # -- CommandInspectingStore.command_backlog -----------------------------------------------

    def test_the_command_backlog_follows_submit_claim_complete_release_and_expiry(self) -> None:
        if (store := self.inspecting()) is None:
            return
        counts = store.command_backlog
        assert counts() == backlog(0, 0, None)
        self.submit(command("c2", created=2), command("c3", created=3))
        assert counts() == backlog(2, 0, 2)
        self.submit(command("c1", created=1))  # submitted last, created first: the oldest
        assert counts() == backlog(3, 0, 1)
        assert self.claimed(10, lease=5, limit=1) == ["c1"]
        assert counts() == backlog(2, 1, 2)
        assert counts() == backlog(2, 1, 2)  # a lease running out moves nothing by itself
        assert self.claimed(20, lease=5, limit=3) == ["c1", "c2", "c3"]  # c1 again: expired
        assert counts() == backlog(0, 3, None)
        self.store.complete_command("c2", now=at(21), outcome="ok")
        assert counts() == backlog(0, 2, None)
        self.store.release_command("c3", now=at(22))
        assert counts() == backlog(1, 1, 3)
        self.store.complete_command("c2", now=at(23))  # finished twice: counted nowhere
        self.store.release_command("c2", now=at(23))
        assert counts() == backlog(1, 1, 3)
        self.store.complete_command("c1", now=at(50))  # finished after its lease ran out
        assert counts() == backlog(1, 0, 3)
        self.store.complete_command("c3", now=at(51))  # finished without a claim
        assert counts() == backlog(0, 0, None)
        self.submit(command("f", created=0.5, finished_at=at(1)),  # arrives finished
                    command("l", created=0.25, lease_until=at(99)))  # arrives leased  # fmt: skip
        assert counts() == backlog(0, 1, None)
        self.submit(command("n", created=7))
        assert counts() == backlog(1, 1, 7)
        self.close_store()
        raises(StoreClosed, counts)

    def test_the_backlog_ages_its_oldest_by_created_at_to_the_microsecond(self) -> None:
        if (store := self.inspecting()) is None:
            return
        self.submit(command("b", created=1.000001), command("a", created=1.000002))
        assert store.command_backlog() == backlog(2, 0, 1.000001)
        assert self.claimed(5, limit=1) == ["b"]
        assert store.command_backlog() == backlog(1, 1, 1.000002)

    # -- WorkerBeatsStore --------------------------------------------------------------------

    def test_worker_beats_follow_join_tick_leave_and_expiry(self) -> None:
        beats, pool = self.store, self.store
        if not isinstance(beats, WorkerBeatsStore) or not isinstance(pool, BucketPoolStore):
            return  # the beats are the pool's: a store has both or neither
        now = T0.replace(microsecond=0)

        def tick(worker: str, seconds: float, **options: Any) -> None:
            pool.pool_tick(worker=worker, now=now + timedelta(seconds=seconds),
                           lease_seconds=5, num_buckets=4, wanted=[0], **options)  # fmt: skip

        def seen() -> dict[str, datetime]:
            found = beats.worker_beats()
            assert set(found) == set(pool.pool_state()[0]), "the live workers of pool_state"
            return found

        def ago(seconds: float) -> datetime:
            return now + timedelta(seconds=seconds)

        assert seen() == {}
        tick("w1", 0)
        assert seen() == {"w1": ago(0)}  # the tick's now, not its expiry
        tick("w2", 1)
        assert seen() == {"w1": ago(0), "w2": ago(1)}
        tick("w1", 2.5)
        assert seen() == {"w1": ago(2.5), "w2": ago(1)}
        tick("w2", 3, leaving=True)
        assert seen() == {"w1": ago(2.5)}
        tick("w3", 4)
        assert seen() == {"w1": ago(2.5), "w3": ago(4)}
        raises(StoreError, pool.pool_tick, worker="w4", now=ago(4), lease_seconds=5,
               num_buckets=8, wanted=[])  # refused: nothing written  # fmt: skip
        assert seen() == {"w1": ago(2.5), "w3": ago(4)}
        tick("w3", 7.5)  # w1's heartbeat ran out at 7.5: dropped in this very step
        assert seen() == {"w3": ago(7.5)}
        tick("w1", 8)  # back after expiring: a new beat
        assert seen() == {"w1": ago(8), "w3": ago(7.5)}
        tick("w1", 13, leaving=True)  # w3 expired at 12.5 and w1 leaves, in one step
        assert seen() == {}
        self.close_store()
        raises(StoreClosed, beats.worker_beats)
