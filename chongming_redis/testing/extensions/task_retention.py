"""The retention duties of ``TaskPoliciesStore`` (``stores/extensions.py``): a finished task
expires ``retention`` seconds after its ``updated_at``; ``expire_finished`` removes exactly the
expired finished tasks, earliest expiry first, with their history and commands, leaving
tombstones; ``expiry_backlog`` counts them; the expiry follows every write that finishes,
reopens or refinishes a task. Every test returns at once when the store does not implement
``TaskPoliciesStore``. Times are the fixed instants of ``contract/support.py``: a task finished
at ``at(s)`` with a retention of ``r`` seconds expires at ``at(s + r)``. Mixed into
``ExtensionsContract``.
"""

from __future__ import annotations

from typing import Any

from chongming_redis.errors import StoreClosed
from chongming_redis.model import Tombstone
from chongming_redis.policy import MAX_RETENTION
from chongming_redis.stores.extensions import (
    CommandInspectingStore,
)
from chongming_redis.testing.contract.support import (
    FAILED,
    LATEST,
    LOST,
    NAIVE,
    ONE_US,
    STOPPED,
    at,
    command,
    counted,
    raises,
)
from chongming_redis.testing.extensions.policy_support import (
    OK,
    PA,
    P,
    PolicySupport,
    R,
    done,
    entry,
    task,
)


class TaskRetentionContract(PolicySupport):
    # -- retention ---------------------------------------------------------------------------

    def test_expire_finished_removes_exactly_the_expired_finished_tasks(self) -> None:
        """Finished, with a retention, ``updated_at + retention <= now`` (to the microsecond,
        the boundary included): nothing else, however old, whatever its status."""
        if (store := self.policies()) is None:
            return
        expired = [done("lost", LOST, 1, 2.0),  # at 3
                   done("edge", OK, 4, 6.0),  # at 10: exactly now
                   done("tie", FAILED, 7, 3.0)]  # fmt: skip
        kept = [done("micro", OK, retention=6.0, updated_at=at(4) + ONE_US),  # 10 s + 1 µs
                done("half", STOPPED, 5, 5.5),  # at 10.5
                task("recent", FAILED, 2, created=-100, updated_at=at(8), retention=5.0),  # 13
                done("long", OK, 0, MAX_RETENTION),
                done("forever", OK, 0),  # no retention
                task("pending", created=0, retention=1.0),
                task("running", R, 2, created=0, retention=1.0),
                task("paused", PA, 2, created=0, retention=1.0)]  # fmt: skip
        self.put(*expired, *kept)
        for t in expired + kept:
            self.store.append(entry(t.task_id, 1))
        removed = store.expire_finished(now=at(10))
        assert removed[:1] == ["lost"] and sorted(removed[1:]) == ["edge", "tie"], removed
        for t in expired:
            assert self.store.get(t.task_id) is None and self.store.history(t.task_id) == []
        for t in kept:
            assert self.store.get(t.task_id) == t, t.task_id
            assert self.store.history(t.task_id) == [entry(t.task_id, 1)], t.task_id
        assert store.expire_finished(now=at(10)) == [], "a second call finds nothing more"
        assert store.expire_finished(now=at(10) + ONE_US) == ["micro"]
        assert store.expire_finished(now=at(10.5)) == ["half"]
        assert store.expire_finished(now=at(13)) == ["recent"]
        assert store.expire_finished(now=LATEST) == ["long"]
        assert store.expire_finished(now=LATEST) == []
        assert self.counts() == counted(succeeded=1, pending=1, running=1, paused=1)
        assert [self.store.get(t.task_id) for t in kept[-4:]] == kept[-4:]

    def test_expire_finished_goes_earliest_expiry_first_within_its_limit(self) -> None:
        """The order is the expiry's, not ``created_at``'s, ``updated_at``'s, the
        retention's or the id's; each call takes at most ``limit`` and the next one goes on."""
        if (store := self.policies()) is None:
            return
        self.put(task("e1", OK, 2, created=4, updated_at=at(5), retention=1.0),  # 6
                 task("e2", FAILED, 2, created=0, updated_at=at(1), retention=8.0),  # 9
                 task("e3", LOST, 2, created=3, updated_at=at(3), retention=4.0),  # 7
                 task("e4", OK, 2, created=1, updated_at=at(2), retention=6.0),  # 8
                 task("e5", STOPPED, 2, created=2, updated_at=at(4), retention=1.5),  # 5.5
                 done("later", OK, 0, 50.0), task("running", R, 2, retention=1.0),
                 done("forever", OK, 0))  # fmt: skip
        assert store.expire_finished(now=at(20), limit=1) == ["e5"]
        assert store.expire_finished(now=at(20), limit=2) == ["e1", "e3"]
        assert store.expire_finished(now=at(20), limit=1000) == ["e4", "e2"]
        assert store.expire_finished(now=at(20)) == []
        assert sorted(self.ids()) == ["forever", "later", "running"]
        self.put(*(done(f"x{i:03d}", OK, i / 1000, 1.0) for i in range(150)))
        assert store.expire_finished(now=at(60)) == [f"x{i:03d}" for i in range(100)]
        assert store.expire_finished(now=at(60)) == [f"x{i:03d}" for i in range(100, 150)] + [
            "later"]  # fmt: skip

    def test_expire_finished_removes_history_and_commands_and_leaves_tombstones(self) -> None:
        """As ``prune`` removes a task: its history and its command listing go, the change
        feed gets a tombstone (the task's name and bucket) kept after it, and the id created
        again is a new task after the tombstone."""
        if (store := self.policies()) is None:
            return
        self.put(task("gone", name="etl.load", bucket=7, unique="g", retention=1.0),
                 done("kept", OK, 2, 10_000.0))  # fmt: skip
        self.store.append(entry("gone", 1))
        self.store.submit_command(command("c1", task_id="gone", created=1))
        self.move("gone", OK, 2)
        self.store.append(entry("gone", 2, OK))
        self.store.append(entry("kept", 2, OK))
        seen = self.feed_after("0")
        assert store.expire_finished(now=at(3)) == ["gone"]
        assert self.store.get("gone") is None and self.store.history("gone") == []
        assert self.store.history("kept") == [entry("kept", 2, OK)]
        inspecting = self.store if isinstance(self.store, CommandInspectingStore) else None
        if inspecting is not None:
            assert inspecting.task_commands("gone") == []
        if seen is not None:
            after = self.feed_after(seen[1])
            assert after is not None and len(after[0]) == 1, "one tombstone, nothing else"
            stone = after[0][0]
            assert isinstance(stone, Tombstone), stone
            assert (stone.task_id, stone.name, stone.bucket, stone.status) == (
                "gone", "etl.load", 7, "removed")  # fmt: skip
            assert stone.removed_at.utcoffset() is not None
        fresh = task("gone", created=5, bucket=2)
        self.put(fresh)
        assert self.store.get("gone") == fresh and self.store.history("gone") == []
        if inspecting is not None:
            assert inspecting.task_commands("gone") == []
        assert store.expire_finished(now=at(1000)) == [], "the new task is not finished"
        if seen is not None:
            everything = self.feed_after("0")
            assert everything is not None
            marks = [("-" if isinstance(i, Tombstone) else "") + i.task_id for i in everything[0]]
            assert marks == ["kept", "-gone", "gone"], "the tombstone is kept, before the new task"

    def test_expire_finished_refuses_bad_arguments_before_any_write(self) -> None:
        if (store := self.policies()) is None:
            return
        victim = done("x", OK, 0, 1.0)
        self.put(victim)
        for limit in (0, 1001, -1):
            raises(ValueError, store.expire_finished, now=at(10), limit=limit)
        for bad_limit in ("5", 5.0, True, None):
            raises(TypeError, store.expire_finished, now=at(10), limit=bad_limit)
        raises(ValueError, store.expire_finished, now=NAIVE)
        raises(ValueError, store.expire_finished, now=at(10).replace(tzinfo=None))
        for bad_now in ("2024-03-10T12:00:10Z", at(10).timestamp(), None):
            raises(TypeError, store.expire_finished, now=bad_now)
        raises(TypeError, store.expire_finished, at(10))  # keyword-only
        raises(ValueError, store.expiry_backlog, now=NAIVE)
        raises(TypeError, store.expiry_backlog, now="2024-03-10T12:00:10Z")
        assert self.store.get("x") == victim, "a refused call removes nothing"
        assert store.expiry_backlog(now=at(10)) == (1, None)
        assert store.expire_finished(now=at(10), limit=1000) == ["x"]  # 1000 is allowed
        self.close_store()
        raises(StoreClosed, store.expire_finished, now=at(10))
        raises(StoreClosed, store.expiry_backlog, now=at(10))

    def test_expiry_backlog_counts_the_expired_and_names_the_next_expiry(self) -> None:
        """``(expired by now and not yet removed, the earliest expiry still ahead)``: both
        to the microsecond, the boundary counted as expired, unfinished and retention-less
        tasks never, following the writes that finish, reopen and remove tasks."""
        if (store := self.policies()) is None:
            return
        assert store.expiry_backlog(now=at(10)) == (0, None)
        self.put(done("a", OK, 1, 2.0), done("b", FAILED, 4, 6.0),  # at 3, at 10
                 done("c", STOPPED, retention=6.0, updated_at=at(4) + ONE_US),  # 10 s + 1 µs
                 done("d", LOST, 5, 20.0), done("n", OK, 0),  # at 25; never
                 task("p", retention=1.0), task("r", R, 2, retention=1.0))  # fmt: skip
        assert store.expiry_backlog(now=at(10)) == (2, at(10) + ONE_US)
        assert store.expiry_backlog(now=at(10)) == (2, at(10) + ONE_US), "reading removes nothing"
        assert store.expiry_backlog(now=at(10) + ONE_US) == (3, at(25))
        assert store.expiry_backlog(now=at(100)) == (4, None)
        assert store.expiry_backlog(now=at(0)) == (0, at(3))
        assert sorted(store.expire_finished(now=at(10))) == ["a", "b"]
        assert store.expiry_backlog(now=at(10)) == (0, at(10) + ONE_US)
        retry, version = self.reopened("c", 11)
        self.store.save(retry, expect_version=version)  # unfinished again: no expiry
        self.move("p", OK, 50)  # finished now: at 51
        assert store.expiry_backlog(now=at(30)) == (1, at(51))
        assert store.expiry_backlog(now=at(100)) == (2, None)
        assert self.counts() == counted(pending=1, running=1, succeeded=2, lost=1)
        self.close_store()
        raises(StoreClosed, store.expiry_backlog, now=at(10))

    def test_the_expiry_follows_every_write_that_finishes_reopens_or_refinishes_a_task(
        self,
    ) -> None:
        """A store that indexes expiries must move the entry with every write: a retry by hand
        never expires, a finished task saved again expires after its new ``updated_at`` (and
        its new retention), a cleared retention never expires; by ``save``, by
        ``commit_tasks`` and through ``start_tasks``."""
        if (store := self.policies()) is None:
            return
        self.put(done("reopened", FAILED, 0, 1.0), done("refinished", OK, 0, 5.0),
                 task("finished", R, 2, retention=2.0), done("longer", OK, 0, 1.0),
                 done("dropped", OK, 0, 1.0))  # fmt: skip
        retry, version = self.reopened("reopened", 1)
        self.store.save(retry, expect_version=version)
        self.move("refinished", OK, 8)  # expires at 13 now, not at 5
        self.move("finished", OK, 3)  # at 5
        self.move("longer", OK, 0, retention=20.0)  # at 20
        self.move("dropped", OK, 0, retention=None)  # never
        expected_now = ["finished"]
        if (batching := self.policy_batching()) is not None:
            self.put(task("c-fin", R, 2, retention=1.0), done("c-reopen", LOST, 0, 1.0),
                     done("c-refin", OK, 0, 1.0))  # fmt: skip
            items: list[Any] = [
                (task("c-fin", OK, 3, updated_at=at(4), retention=1.0), 2, []),  # at 5
                (task("c-reopen", P, 3, updated_at=at(1), retention=1.0), 2, []),  # never
                (task("c-refin", OK, 3, updated_at=at(9.5), retention=2.0), 2, []),  # at 11.5
            ]
            assert batching.commit_tasks(items) == [None, None, None]
            started = batching.start_tasks(owner="w1", now=at(9), lease_until=at(99), buckets=[0])
            assert sorted(s.task_id for s in started) == ["c-reopen", "reopened"]
            expected_now = ["c-fin", "finished"]
        assert sorted(store.expire_finished(now=at(10))) == expected_now
        if batching is not None:
            assert store.expiry_backlog(now=at(10)) == (0, at(11.5))
            assert store.expire_finished(now=at(12)) == ["c-refin"]
        assert store.expiry_backlog(now=at(12)) == (0, at(13))
        assert store.expire_finished(now=at(20)) == ["refinished", "longer"]
        assert store.expire_finished(now=LATEST) == []
        survivors = ["dropped", "reopened"] + (["c-reopen"] if batching is not None else [])
        assert sorted(self.ids()) == sorted(survivors)
