"""The contract of ``TaskPoliciesStore`` (``stores/extensions.py``): the policy fields
(``retry``, ``timeout``, ``deadline``, ``retention``, ``unique``) round-trip through every write
and read; ``start_tasks`` writes each attempt's deadline; a unique id lives and dies with its
task (taken by the create, refused to a second unfinished holder, let go by the write that
finishes the task and by its removal, taken again by a retry by hand). Expiry is
``task_retention``'s; both use ``policy_support``. Mixed into ``ExtensionsContract``.

The round trip is every store's duty (``TaskSnapshot`` carries the fields whatever the store
offers), so it runs on any store, its batched part when the store batches; every other test
returns at once when the store does not implement ``TaskPoliciesStore``. The tests follow the
duties through the writes that move them (a save, a batched commit, a start, ``prune``) rather
than checking one fresh value, because a store that indexes unique ids and expiries must keep
those indexes in the step that moves the task. Times are the fixed instants of
``contract/support.py``: a task finished at ``at(s)`` with a retention of ``r`` seconds expires
at ``at(s + r)``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from chongming_redis.errors import StoreClosed, TaskAlreadyExists, UniqueTaken
from chongming_redis.model import TaskQuery
from chongming_redis.policy import MAX_RETENTION, MAX_TIMEOUT
from chongming_redis.testing.contract.support import (
    AWKWARD_IDS,
    FAILED,
    LOST,
    STOPPED,
    TERMINAL,
    at,
    counted,
    raises,
)
from chongming_redis.testing.extensions.policy_support import (
    NEVER,
    OK,
    PA,
    POLICY,
    TZ,
    P,
    PolicySupport,
    R,
    entry,
    task,
)


class TaskPoliciesContract(PolicySupport):
    # -- the fields --------------------------------------------------------------------------

    def test_the_policy_fields_round_trip_through_every_write_and_read(self) -> None:
        """Every field, ``None`` and set, exactly: a policy with its exception names (an empty
        tuple too), float seconds that are not whole milliseconds, a deadline in another
        timezone with microseconds, a unique id with characters keys and patterns dislike."""
        deadline = datetime(2024, 3, 10, 17, 45, 2, 345678, tzinfo=TZ)
        full = task("full", R, 3, retry=POLICY, timeout=1 / 3, deadline=deadline,
                    retention=MAX_RETENTION, unique="order:42/ü {x}*")  # fmt: skip
        bare = task("bare", created=1)
        edge = task("edge", PA, 2, created=2, retry=NEVER, timeout=MAX_TIMEOUT, retention=0.0015,
                    unique="é" * 512)  # fmt: skip
        self.put(full, bare, edge)
        assert [self.store.get(t) for t in ("full", "bare", "edge")] == [full, bare, edge]
        assert {s.task_id: s for s in self.store.query()} == {"full": full, "bare": bare,
                                                              "edge": edge}  # fmt: skip
        assert self.store.query(TaskQuery(statuses=frozenset({R}))) == [full]
        cleared = replace(full, status_version=4, retry=None, timeout=None, deadline=None,
                          retention=None, updated_at=at(5))  # fmt: skip
        self.store.save(cleared, expect_version=3)
        filled = replace(bare, status_version=2, retry=POLICY, timeout=2.5, deadline=at(3),
                         retention=86400.0, updated_at=at(5))  # fmt: skip
        self.store.save(filled, expect_version=1)
        assert self.store.get("full") == cleared and self.store.get("bare") == filled
        if (store := self.policy_batching()) is None:
            return
        created = task("c", created=3, retry=NEVER, timeout=0.0015, deadline=at(9),
                       retention=1 / 7, unique="c-1")  # fmt: skip
        saved = replace(edge, status_version=3, retry=POLICY, timeout=None, deadline=deadline,
                        retention=None, updated_at=at(6))  # fmt: skip
        items: list[Any] = [(created, None, [entry("c", 1)]), (saved, 2, [])]
        assert store.commit_tasks(items) == [None, None]
        assert self.store.get("c") == created and self.store.get("edge") == saved
        waiting = task("s", created=4, bucket=3, retry=POLICY, deadline=at(7), retention=60.0,
                       unique="s-1")  # fmt: skip
        self.put(waiting)
        (started,) = store.start_tasks(owner="w1", now=at(100), lease_until=at(130), buckets=[3])
        expected = replace(waiting, status=R, status_version=2, updated_at=at(100),
                           heartbeat_at=at(100), lease_owner="w1", lease_until=at(130))  # fmt: skip
        assert started == expected and self.store.get("s") == expected, "a start keeps them all"

    def test_start_sets_the_deadline_from_the_timeout_and_keeps_it_without_one(self) -> None:
        """``deadline = now + timeout`` for each task started with a ``timeout`` (whatever
        deadline an earlier attempt left), to the microsecond; kept as it is without one; and
        written again by the start of every later attempt."""
        if self.policies() is None or (store := self.policy_batching()) is None:
            return
        tasks = [task("timed", created=1, timeout=2.5), task("untimed", created=2),
                 task("kept", created=3, deadline=at(7)),
                 task("stale", created=4, timeout=30.0, deadline=at(5)),
                 task("fine", created=5, timeout=0.0015)]  # fmt: skip
        self.put(*tasks)
        started = store.start_tasks(owner="w1", now=at(100), lease_until=at(130), buckets=[0])
        deadlines = {"timed": at(102.5), "untimed": None, "kept": at(7), "stale": at(130),
                     "fine": at(100) + timedelta(microseconds=1500)}  # fmt: skip
        assert [s.task_id for s in started] == [t.task_id for t in tasks]
        for before, after in zip(tasks, started):
            expected = replace(before, status=R, status_version=2, updated_at=at(100),
                               heartbeat_at=at(100), lease_owner="w1", lease_until=at(130),
                               deadline=deadlines[before.task_id])  # fmt: skip
            assert after == expected, before.task_id
            assert self.store.get(before.task_id) == expected, "returned as stored"
        # A retry: the next attempt's start writes its own deadline over the last one's.
        retry = replace(started[0], status=P, status_version=3, updated_at=at(101), attempt=2)
        self.store.save(retry, expect_version=2)
        assert self.store.get("timed") == retry, "a save writes the deadline it is given"
        (again,) = store.start_tasks(owner="w2", now=at(200), lease_until=at(230), buckets=[0])
        assert again.task_id == "timed" and again.deadline == at(202.5)
        stored = self.store.get("timed")
        assert stored is not None and stored.deadline == at(202.5)

    # -- unique ids --------------------------------------------------------------------------

    def test_a_create_with_a_held_unique_is_unique_taken_and_writes_nothing(self) -> None:
        if (store := self.policies()) is None:
            return
        assert store.unique_holder("u") is None
        holder = task("a", unique="u")
        self.put(holder)
        assert store.unique_holder("u") == "a"
        seen = self.feed_after("0")
        for newcomer in (task("b", unique="u", created=1), task("b", R, 2, unique="u"),
                         task("b", PA, 2, unique="u")):  # fmt: skip
            for _ in range(2):  # a second try is refused the same way
                taken = raises(UniqueTaken, self.store.create, newcomer)
                assert (taken.unique, taken.holder) == ("u", "a")
        assert self.store.get("b") is None and self.store.history("b") == []
        assert self.counts() == counted(pending=1)
        assert self.store.get("a") == holder and store.unique_holder("u") == "a"
        if seen is not None:
            assert self.feed_after(seen[1]) == ([], seen[1]), "a refused create is not a change"
        # Its own id again: the task exists (the id is not held by *another* task).
        raises(TaskAlreadyExists, self.store.create, task("a", unique="u", bucket=3))
        # Other unique ids are free: exact, case-sensitive, never a prefix.
        self.put(task("c", unique="U"), task("d", unique="u:"), task("e", unique="uu"),
                 task("f"), task("g"))  # fmt: skip
        assert self.holders(store, "u", "U", "u:", "uu", "u ") == ["a", "c", "d", "e", None]
        assert self.counts() == counted(pending=6)

    def test_commit_tasks_refuses_a_held_unique_per_item_and_applies_the_others(self) -> None:
        if (store := self.policies()) is None or (batching := self.policy_batching()) is None:
            return
        self.put(task("a", unique="u"), task("s", R, 2))
        items: list[Any] = [
            (task("b", unique="u"), None, [entry("b", 1)]),  # held by a
            (task("c", unique="v"), None, [entry("c", 1)]),
            (task("d", unique="w"), None, []),
            (task("s", OK, 3), 2, [entry("s", 3, OK)]),
            (task("e"), None, []),
        ]
        b, c, d, s, e = batching.commit_tasks(items)
        assert isinstance(b, UniqueTaken) and (b.unique, b.holder) == ("u", "a")
        assert [c, d, s, e] == [None, None, None, None]
        assert self.store.get("b") is None and self.store.history("b") == []
        assert self.store.get("c") == task("c", unique="v")
        assert self.store.history("c") == [entry("c", 1)]
        assert self.store.history("s") == [entry("s", 3, OK)]
        assert self.holders(store, "u", "v", "w") == ["a", "c", "d"]
        # Two unique ids taken by one call are both held now.
        again = batching.commit_tasks([(task("b", unique="v"), None, [entry("b", 1)]),
                                       (task("x", unique="w"), None, []),
                                       (task("y", unique="z"), None, [entry("y", 1)])])  # fmt: skip
        assert [(type(r), getattr(r, "holder", None)) for r in again] == [
            (UniqueTaken, "c"), (UniqueTaken, "d"), (type(None), None)]  # fmt: skip
        assert self.store.get("b") is None and self.store.get("x") is None
        assert self.store.history("b") == [] and self.store.history("y") == [entry("y", 1)]
        assert self.holders(store, "u", "v", "w", "z") == ["a", "c", "d", "y"]
        assert self.counts() == counted(pending=5, succeeded=1)

    def test_two_creates_of_one_unique_in_one_call_create_only_the_first(self) -> None:
        """The items of one ``commit_tasks`` take unique ids in order: the second create of
        an id the first just took is ``UniqueTaken`` naming the first, and writes nothing."""
        if (store := self.policies()) is None or (batching := self.policy_batching()) is None:
            return
        first, second, other = batching.commit_tasks([
            (task("f1", unique="dup"), None, [entry("f1", 1)]),
            (task("f2", unique="dup"), None, [entry("f2", 1)]),
            (task("f3", unique="solo"), None, []),
        ])  # fmt: skip
        assert first is None and other is None
        assert isinstance(second, UniqueTaken) and (second.unique, second.holder) == ("dup", "f1")
        assert self.store.get("f2") is None and self.store.history("f2") == []
        assert self.holders(store, "dup", "solo") == ["f1", "f3"]
        assert self.counts() == counted(pending=2)

    def test_the_write_that_finishes_the_holder_lets_its_unique_go(self) -> None:
        """Each final status, by ``save`` (and by ``commit_tasks``): held while ``PENDING``,
        ``RUNNING`` and ``PAUSED``, free from the very write that finishes the task."""
        if (store := self.policies()) is None:
            return
        for i, final in enumerate(TERMINAL):
            unique, holder, newcomer = f"u-{final.value}", f"h{i}", f"n{i}"
            self.put(task(holder, unique=unique, created=i))
            for status in (R, PA, R):
                self.move(holder, status, i + 1)
                assert store.unique_holder(unique) == holder, (final, status)
                raises(UniqueTaken, self.store.create, task(newcomer, unique=unique))
            finished = self.move(holder, final, i + 2)
            assert store.unique_holder(unique) is None, final
            assert self.store.get(holder) == finished, "the task keeps its unique field"
            self.put(task(newcomer, unique=unique, created=i + 3))
            assert store.unique_holder(unique) == newcomer, final
        if (batching := self.policy_batching()) is None:
            return
        self.put(task("ch", R, 2, unique="cu"), task("cx", R, 2, unique="cx"))
        results = batching.commit_tasks([(task("ch", LOST, 3, unique="cu"), 2, []),
                                         (task("cx", PA, 3, unique="cx"), 2, [])])  # fmt: skip
        assert results == [None, None]
        assert self.holders(store, "cu", "cx") == [None, "cx"]
        assert batching.commit_tasks([(task("cn", unique="cu"), None, [])]) == [None]
        assert store.unique_holder("cu") == "cn"

    def test_a_retry_by_hand_takes_the_unique_again_or_is_refused_while_another_holds_it(
        self,
    ) -> None:
        if (store := self.policies()) is None:
            return
        self.put(task("a", unique="u"))
        self.move("a", FAILED, 1)
        assert store.unique_holder("u") is None
        retry, version = self.reopened("a", 2)
        self.store.save(retry, expect_version=version)
        assert store.unique_holder("u") == "a", "the retry took it again"
        assert raises(UniqueTaken, self.store.create, task("b", unique="u")).holder == "a"
        self.move("a", STOPPED, 3)
        self.put(task("b", unique="u", created=4))  # free again: b takes it
        before = self.store.get("a")
        retry, version = self.reopened("a", 5)
        taken = raises(UniqueTaken, self.store.save, retry, expect_version=version)
        assert (taken.unique, taken.holder) == ("u", "b")
        assert self.store.get("a") == before and store.unique_holder("u") == "b"
        batching = self.policy_batching()
        if batching is not None:
            (error,) = batching.commit_tasks([(retry, version, [entry("a", version + 1)])])
            assert isinstance(error, UniqueTaken) and (error.unique, error.holder) == ("u", "b")
            assert self.store.get("a") == before and self.store.history("a") == []
        # A save that keeps the task finished takes nothing, so nothing refuses it.
        resaved = self.move("a", STOPPED, 6)
        assert self.store.get("a") == resaved and store.unique_holder("u") == "b"
        self.move("b", OK, 7)
        retry, version = self.reopened("a", 8)
        if batching is not None:
            assert batching.commit_tasks([(retry, version, [entry("a", version + 1)])]) == [None]
        else:
            self.store.save(retry, expect_version=version)
        assert self.store.get("a") == retry and store.unique_holder("u") == "a"
        assert raises(UniqueTaken, self.store.create, task("c", unique="u")).holder == "a"

    def test_unique_holder_names_only_an_unfinished_holder_exactly(self) -> None:
        if (store := self.policies()) is None:
            return
        assert store.unique_holder("u") is None
        self.put(task("done", OK, 2, unique="u"))  # finished: it holds nothing
        assert store.unique_holder("u") is None
        self.put(task("p", unique="u", created=1), task("r", R, 2, unique="r"),
                 task("pa", PA, 2, unique="pa"))  # fmt: skip
        assert self.holders(store, "u", "r", "pa") == ["p", "r", "pa"]
        awkward = [task(f"t{i}", unique=u, created=i) for i, u in enumerate(AWKWARD_IDS)]
        self.put(*awkward)  # each its own unique id: none is taken by another
        assert self.holders(store, *AWKWARD_IDS) == [t.task_id for t in awkward]
        assert self.holders(store, "nobody", "t0", "**", "%%") == [None] * 4
        raises(ValueError, store.unique_holder, "")
        raises(ValueError, store.unique_holder, "\ud800")
        raises(ValueError, store.unique_holder, "x" * 1025)
        raises(TypeError, store.unique_holder, None)
        raises(TypeError, store.unique_holder, b"u")
        self.close_store()
        raises(StoreClosed, store.unique_holder, "u")

    def test_a_removed_task_takes_its_unique_along_and_its_id_starts_afresh(self) -> None:
        """Pruned or expired, the task's unique id goes with it: the same id created again
        (without it) holds nothing, and another task takes it."""
        if (store := self.policies()) is None:
            return
        self.put(task("a", unique="u"))
        self.move("a", OK, 1)
        assert self.store.prune(keep_terminal=0) == 1
        self.put(task("a", created=2))
        assert store.unique_holder("u") is None
        self.put(task("b", unique="u", created=3))
        assert store.unique_holder("u") == "b"
        self.move("a", OK, 4)  # the new "a" finishing lets nothing of b's go
        assert store.unique_holder("u") == "b"
        self.put(task("c", unique="v", retention=5.0))
        self.move("c", FAILED, 10)
        assert store.expire_finished(now=at(15)) == ["c"]
        self.put(task("c", created=16))
        assert store.unique_holder("v") is None
        self.put(task("d", unique="v", created=17))
        assert store.unique_holder("v") == "d"
        self.put(task("e", unique="w", retention=1.0))
        self.move("e", STOPPED, 20)
        assert store.expire_finished(now=at(21)) == ["e"]
        self.put(task("e", unique="w", created=22))  # the id again, with its unique id
        assert self.holders(store, "u", "v", "w") == ["b", "d", "e"]
