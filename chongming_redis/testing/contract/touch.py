"""``touch``: the side path that never touches the version."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from chongming_redis import (
    Progress,
)
from chongming_redis.testing.contract.support import (
    NAIVE,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    ContractBase,
    at,
    counted,
    raises,
    snapshot,
)


class TouchRules(ContractBase):
    # -- touch -------------------------------------------------------------------------------

    def test_touch_never_bumps_the_status_version(self) -> None:
        self.put(snapshot("t1", status=RUNNING, version=3))
        for i in range(5):
            self.store.touch("t1", progress=Progress(i), heartbeat_at=at(i))
            self.store.touch("t1", lease_owner="w", lease_until=at(30 + i))
        got = self.store.get("t1")
        assert got is not None and got.status_version == 3
        self.store.save(snapshot("t1", status=SUCCEEDED, version=4), expect_version=3)

    def test_touch_writes_progress_and_nothing_else(self) -> None:
        before = snapshot("t1", status=RUNNING, version=2, params={"p": 1})
        self.put(before)
        self.store.touch("t1", progress=Progress(3.5, 7, "step ✓"))
        self.assert_untouched(replace(before, progress=Progress(3.5, 7, "step ✓")))

    def test_touch_writes_the_heartbeat_and_nothing_else(self) -> None:
        before = snapshot("t1", status=RUNNING, progress=Progress(1))
        self.put(before)
        self.store.touch("t1", heartbeat_at=at(12.5))
        self.assert_untouched(replace(before, heartbeat_at=at(12.5)))

    def test_touch_writes_the_lease_and_nothing_else(self) -> None:
        before = snapshot("t1", status=RUNNING, heartbeat_at=at(1))
        self.put(before)
        self.store.touch("t1", lease_owner="w1", lease_until=at(60))
        self.assert_untouched(replace(before, lease_owner="w1", lease_until=at(60)))

    def test_touch_takes_each_argument_on_its_own(self) -> None:
        before = snapshot("t1")
        self.put(before)
        self.store.touch("t1", lease_owner="w1")
        self.assert_untouched(replace(before, lease_owner="w1"))
        self.store.touch("t1", lease_until=at(9))
        self.assert_untouched(replace(before, lease_owner="w1", lease_until=at(9)))
        self.store.touch("t1", heartbeat_at=at(3))
        expected = replace(before, lease_owner="w1", lease_until=at(9), heartbeat_at=at(3))
        self.assert_untouched(expected)
        self.store.touch("t1", progress=Progress(1))
        self.assert_untouched(replace(expected, progress=Progress(1)))

    def test_touch_keeps_the_values_of_arguments_it_was_not_given(self) -> None:
        self.put(snapshot("t1"))
        self.store.touch(
            "t1", progress=Progress(1, 2), heartbeat_at=at(1), lease_owner="w", lease_until=at(5)
        )
        self.store.touch("t1", progress=Progress(2, 2))
        self.store.touch("t1", heartbeat_at=at(2))
        got = self.store.get("t1")
        assert got is not None
        assert got.progress == Progress(2, 2) and got.heartbeat_at == at(2)
        assert (got.lease_owner, got.lease_until) == ("w", at(5))

    def test_touch_with_every_argument_none_changes_nothing(self) -> None:
        before = snapshot("t1", progress=Progress(1), heartbeat_at=at(1))
        self.put(before)
        self.store.touch("t1")
        self.store.touch("t1", progress=None, heartbeat_at=None, lease_owner=None, lease_until=None)
        self.assert_untouched(before)

    def test_touch_of_a_missing_task_is_silent_and_creates_nothing(self) -> None:
        self.store.touch(
            "ghost", progress=Progress(1), heartbeat_at=at(1), lease_owner="w", lease_until=at(2)
        )
        self.store.touch("ghost")
        assert self.store.get("ghost") is None
        assert self.store.query() == []
        assert self.counts() == counted()

    def test_touch_stores_heartbeat_and_lease_exactly_as_given(self) -> None:
        self.put(snapshot("t1", status=RUNNING))
        heartbeat = datetime(2024, 3, 10, 14, 0, 0, 1, tzinfo=timezone(timedelta(hours=2)))
        until = at(-3600)  # an expired lease, earlier than the heartbeat: stored as is
        self.store.touch("t1", heartbeat_at=heartbeat, lease_owner="w", lease_until=until)
        got = self.store.get("t1")
        assert got is not None
        assert got.heartbeat_at == heartbeat and got.lease_until == until

    def test_touch_never_derives_the_heartbeat_from_the_lease_or_back(self) -> None:
        self.put(snapshot("lease"), snapshot("beat", created=1))
        self.store.touch("lease", lease_owner="w", lease_until=at(30))
        self.store.touch("beat", heartbeat_at=at(7))
        lease, beat = self.store.get("lease"), self.store.get("beat")
        assert lease is not None and beat is not None
        assert lease.heartbeat_at is None
        assert (beat.lease_owner, beat.lease_until) == (None, None)

    def test_touch_refuses_a_naive_datetime_and_changes_nothing(self) -> None:
        before = snapshot("t1")
        self.put(before)
        naive = datetime(2024, 3, 10, 12, 0)
        raises(ValueError, self.store.touch, "t1", heartbeat_at=naive)
        raises(ValueError, self.store.touch, "t1", lease_owner="w", lease_until=naive)
        self.assert_untouched(before)

    # -- touch (round two) -------------------------------------------------------------------

    def test_a_touch_of_a_missing_task_leaves_nothing_behind(self) -> None:
        self.store.touch("ghost", progress=Progress(1, 2, "m"), heartbeat_at=at(1),
                         lease_owner="w", lease_until=at(2))  # fmt: skip
        fresh = snapshot("ghost", created=5)
        self.store.create(fresh)
        assert self.store.get("ghost") == fresh
        assert self.store.query() == [fresh]
        assert self.counts() == counted(pending=1)

    def test_a_touch_after_prune_leaves_nothing_behind(self) -> None:
        self.put(snapshot("t1", status=SUCCEEDED))
        self.store.prune(keep_terminal=0)
        self.store.touch("t1", heartbeat_at=at(1), lease_owner="w", lease_until=at(2))
        assert self.store.get("t1") is None
        self.put(snapshot("t1", created=3))
        assert self.store.get("t1") == snapshot("t1", created=3)

    def test_a_terminal_task_is_still_touched(self) -> None:
        for i, status in enumerate(TERMINAL):
            before = snapshot(status.value, status=status, version=4, created=i)
            self.put(before)
            self.store.touch(status.value, progress=Progress(9, 9), heartbeat_at=at(7),
                             lease_owner="w", lease_until=at(8))  # fmt: skip
            expected = replace(before, progress=Progress(9, 9), heartbeat_at=at(7),
                               lease_owner="w", lease_until=at(8))  # fmt: skip
            self.assert_untouched(expected)

    def test_a_given_progress_replaces_all_three_progress_fields(self) -> None:
        self.put(snapshot("t1", status=RUNNING, progress=Progress(1, 10, "first")))
        self.store.touch("t1", progress=Progress(2))
        got = self.store.get("t1")
        assert got is not None and got.progress == Progress(2, None, None)
        self.store.touch("t1", progress=Progress(3, None, "only a message"))
        got = self.store.get("t1")
        assert got is not None and got.progress == Progress(3, None, "only a message")
        self.store.touch("t1", progress=Progress(0, 5))
        got = self.store.get("t1")
        assert got is not None and got.progress == Progress(0, 5, None)

    def test_touch_changes_only_the_task_it_names(self) -> None:
        others = [snapshot(i, status=RUNNING, created=n) for n, i in enumerate(("t", "t10", "T1"))]
        self.put(snapshot("t1", status=RUNNING, created=9), *others)
        self.store.touch("t1", progress=Progress(1), heartbeat_at=at(1), lease_owner="w",
                         lease_until=at(2))  # fmt: skip
        for other in others:
            self.assert_untouched(other)

    def test_touch_can_set_a_lease_again_after_it_expired(self) -> None:
        self.put(snapshot("t1", status=RUNNING))
        self.store.touch("t1", lease_owner="w1", lease_until=at(1))
        self.store.touch("t1", lease_owner="w2", lease_until=at(100))
        got = self.store.get("t1")
        assert got is not None and (got.lease_owner, got.lease_until) == ("w2", at(100))
        assert got.status_version == 1

    # -- found by an independent review of the suite (round two) --------------------

    def test_a_touch_refused_for_one_argument_writes_none_of_the_others(self) -> None:
        before = snapshot("t1", status=RUNNING)
        self.put(before)
        raises(ValueError, self.store.touch, "t1", progress=Progress(5), heartbeat_at=NAIVE)
        raises(ValueError, self.store.touch, "t1", heartbeat_at=at(5), lease_owner="")
        raises(TypeError, self.store.touch, "t1", heartbeat_at=at(5), lease_owner=7)
        raises(
            ValueError,
            self.store.touch,
            "t1",
            progress=Progress(5),
            lease_owner="w",
            lease_until=NAIVE,
        )
        self.assert_untouched(before)

    def test_touch_refuses_a_progress_that_is_not_a_progress(self) -> None:
        before = snapshot("t1")
        self.put(before)
        for wrong in ({"current": 1}, 5, (1, 2)):
            raises(TypeError, self.store.touch, "t1", progress=wrong)
        self.assert_untouched(before)

    def test_touch_stores_an_earlier_heartbeat_and_a_shorter_lease_as_given(self) -> None:
        self.put(snapshot("t1", status=RUNNING))
        self.store.touch("t1", heartbeat_at=at(10), lease_owner="w", lease_until=at(60))
        self.store.touch("t1", heartbeat_at=at(5), lease_until=at(20))
        got = self.store.get("t1")
        assert got is not None and (got.heartbeat_at, got.lease_until) == (at(5), at(20))

    def test_touch_writes_zero_and_empty_progress_values_as_given(self) -> None:
        self.put(snapshot("t1", status=RUNNING, progress=Progress(1, 2, "m")))
        self.store.touch("t1", progress=Progress(0, 0, ""))
        got = self.store.get("t1")
        assert got is not None and got.progress == Progress(0, 0, "")
        assert got.progress.total is not None and got.progress.message is not None
