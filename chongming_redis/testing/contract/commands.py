"""Control commands: submit, claim, complete, release."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from chongming_redis import (
    Command,
    CommandAlreadyExists,
    CommandKind,
    CommandNotFound,
    StoreError,
)
from chongming_redis.testing.contract.support import (
    MAX_CLAIM_LIMIT,
    MAX_LEASE_SECONDS,
    NAIVE,
    ONE_US,
    RUNNING,
    SUCCEEDED,
    T0,
    ContractBase,
    at,
    command,
    counted,
    raises,
    snapshot,
)


class CommandRules(ContractBase):
    # -- commands ----------------------------------------------------------------------------

    def test_claim_leases_until_now_plus_lease_seconds(self) -> None:
        assert self.store.claim_commands(now=at(0), lease_seconds=30) == []
        self.store.submit_command(command("c1"))
        got = self.store.claim_commands(now=at(100), lease_seconds=30, limit=10)
        assert got == [replace(command("c1"), lease_until=at(130))]
        assert got[0].finished_at is None

    def test_claim_honours_a_fractional_lease(self) -> None:
        self.store.submit_command(command("c1"))
        got = self.store.claim_commands(now=at(0), lease_seconds=0.25, limit=1)
        assert [c.lease_until for c in got] == [at(0.25)]
        assert self.claimed(0.25 - 1e-6) == []
        assert self.claimed(0.25) == ["c1"]

    def test_claim_returns_oldest_created_first_with_ties_by_command_id(self) -> None:
        for command_id, created in (("d", 3), ("b", 1), ("c", 1), ("a", 2), ("0", 9)):
            self.store.submit_command(command(command_id, created=created))
        assert self.claimed(100) == ["b", "c", "a", "d", "0"]

    def test_claim_respects_the_limit_and_leaves_the_rest_claimable(self) -> None:
        for i in range(5):
            self.store.submit_command(command(f"c{i}", created=i))
        assert self.claimed(10, limit=2) == ["c0", "c1"]
        assert self.claimed(10, limit=1) == ["c2"]
        assert self.claimed(10, limit=50) == ["c3", "c4"]
        assert self.claimed(10) == []

    def test_a_leased_command_is_not_claimed_again_before_its_lease_expires(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        assert self.claimed(0, lease=30) == []
        assert self.claimed(15) == []
        got = self.store.claim_commands(now=at(30) - ONE_US, lease_seconds=30)
        assert got == []

    def test_a_command_is_claimable_again_once_its_lease_has_expired(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        again = self.store.claim_commands(now=at(30), lease_seconds=10)
        assert again == [replace(command("c1"), lease_until=at(40))]
        assert self.claimed(39) == []
        assert self.claimed(41) == ["c1"]

    def test_claim_skips_leased_commands_and_takes_the_next_ones(self) -> None:
        for i in range(3):
            self.store.submit_command(command(f"c{i}", created=i))
        assert self.claimed(0, limit=1) == ["c0"]
        self.store.submit_command(command("late", created=-5))
        assert self.claimed(1) == ["late", "c1", "c2"]

    def test_a_completed_command_is_never_claimed_again(self) -> None:
        self.store.submit_command(command("c1"))
        self.store.submit_command(command("c2", created=1))
        assert self.claimed(0, lease=30) == ["c1", "c2"]
        self.store.complete_command("c1", now=at(1), outcome="stopped")
        assert self.claimed(31) == ["c2"]
        assert self.claimed(10_000) == ["c2"]
        self.store.submit_command(command("never-claimed"))
        self.store.complete_command("never-claimed", now=at(1), outcome="already-terminal")
        assert self.claimed(20_000) == ["c2"]

    def test_completing_a_finished_command_again_is_harmless(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0) == ["c1"]
        self.store.complete_command("c1", now=at(1), outcome="stopped")
        self.store.complete_command("c1", now=at(2), outcome="other")
        self.store.complete_command("c1", now=at(3))
        assert self.claimed(100) == []

    def test_release_makes_a_claimed_command_claimable_at_once(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        self.store.release_command("c1", now=at(1))
        got = self.store.claim_commands(now=at(1), lease_seconds=30)
        assert got == [replace(command("c1"), lease_until=at(31))]

    def test_release_does_not_complete_the_command(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        self.store.release_command("c1", now=at(1))
        self.store.release_command("c1", now=at(1))
        assert self.claimed(100, lease=30) == ["c1"]
        self.store.complete_command("c1", now=at(101), outcome="stopped")
        assert self.claimed(1000) == []

    def test_release_of_an_unclaimed_command_leaves_it_claimable(self) -> None:
        self.store.submit_command(command("c1"))
        self.store.release_command("c1", now=at(0))
        assert self.claimed(0) == ["c1"]

    def test_release_of_a_finished_command_leaves_it_finished(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0) == ["c1"]
        self.store.complete_command("c1", now=at(1), outcome="stopped")
        self.store.release_command("c1", now=at(2))
        assert self.claimed(2) == []
        assert self.claimed(1000) == []

    def test_complete_of_an_unknown_command_raises_command_not_found(self) -> None:
        error = raises(CommandNotFound, self.store.complete_command, "nope", now=at(0))
        assert isinstance(error, StoreError) and error.command_id == "nope"
        assert self.claimed(0) == []

    def test_release_of_an_unknown_command_raises_command_not_found(self) -> None:
        error = raises(CommandNotFound, self.store.release_command, "nope", now=at(0))
        assert isinstance(error, StoreError) and error.command_id == "nope"
        assert self.claimed(0) == []

    def test_submit_of_an_existing_command_id_raises_and_keeps_the_original(self) -> None:
        original = command("c1", kind=CommandKind.STOP, payload={"v": 1})
        self.store.submit_command(original)
        duplicate = command("c1", kind=CommandKind.PAUSE, created=-1, payload={"v": 2})
        error = raises(CommandAlreadyExists, self.store.submit_command, duplicate)
        assert isinstance(error, StoreError) and error.command_id == "c1"
        claimed = self.store.claim_commands(now=at(0), lease_seconds=5)
        assert claimed == [replace(original, lease_until=at(5))]

    def test_submitting_a_command_does_not_touch_tasks(self) -> None:
        before = snapshot("t1", status=RUNNING)
        self.put(before)
        self.store.submit_command(command("c1", task_id="t1"))
        self.assert_untouched(before)
        assert self.store.history("t1") == []

    def test_claim_refuses_a_lease_that_is_not_a_positive_finite_number(self) -> None:
        self.store.submit_command(command("c1"))
        for bad in (0, 0.0, -1, -0.5, float("nan"), float("inf")):
            raises(ValueError, self.store.claim_commands, now=at(0), lease_seconds=bad)
        for wrong in (True, "30", None):
            raises(TypeError, self.store.claim_commands, now=at(0), lease_seconds=wrong)
        assert self.claimed(0) == ["c1"]

    def test_claim_refuses_a_limit_outside_one_to_a_thousand(self) -> None:
        self.store.submit_command(command("c1"))
        for bad in (0, -1, MAX_CLAIM_LIMIT + 1):
            raises(ValueError, self.store.claim_commands, now=at(0), lease_seconds=1, limit=bad)
        for wrong in (True, 1.0, "5"):
            raises(TypeError, self.store.claim_commands, now=at(0), lease_seconds=1, limit=wrong)
        assert self.claimed(0, limit=MAX_CLAIM_LIMIT) == ["c1"]

    def test_claim_complete_and_release_refuse_a_naive_now(self) -> None:
        self.store.submit_command(command("c1"))
        naive = datetime(2024, 3, 10, 12, 0)
        raises(ValueError, self.store.claim_commands, now=naive, lease_seconds=30)
        raises(ValueError, self.store.complete_command, "c1", now=naive)
        raises(ValueError, self.store.release_command, "c1", now=naive)
        assert self.claimed(0) == ["c1"]

    # -- commands over time (round two) ------------------------------------------------------

    def test_finished_commands_never_occupy_the_claim_window(self) -> None:
        for i in range(300):
            self.store.submit_command(command(f"old{i:03}", created=i / 1000))
        assert len(self.claimed(1, limit=MAX_CLAIM_LIMIT)) == 300
        for i in range(300):
            self.store.complete_command(f"old{i:03}", now=at(2))
        self.store.submit_command(command("new", created=5))
        assert self.claimed(10, limit=1) == ["new"]
        self.store.submit_command(command("newer", created=6))
        assert self.claimed(10, limit=1) == ["newer"]

    def test_commands_completed_without_a_claim_never_occupy_the_claim_window(self) -> None:
        """A command its holder completed without ever claiming it (a stop answered because
        the task ended first) leaves the queue in that completion: later commands are claimed
        at once, whatever the number of such commands before them."""
        for i in range(300):
            self.store.submit_command(command(f"done{i:03}", created=i / 1000))
        for i in range(300):
            self.store.complete_command(f"done{i:03}", now=at(1), outcome="ok")
        self.store.submit_command(command("new", created=5))
        assert self.claimed(10, limit=1) == ["new"]
        self.store.submit_command(command("newer", created=6))
        self.store.submit_command(command("newest", created=7))
        assert self.claimed(10, limit=2) == ["newer", "newest"]
        assert self.claimed(100, limit=MAX_CLAIM_LIMIT) == ["new", "newer", "newest"]

    def test_commands_completed_unclaimed_between_open_ones_never_shrink_the_window(self) -> None:
        """The same rule where the never-claimed finished commands lie between open ones, not
        only at the head of the queue: a claim of ``limit`` N takes N open commands, however
        many such finished ones are older than the later ones, and the finished stay finished."""
        self.store.submit_command(command("open0", created=0))
        for i in range(5):
            self.store.submit_command(command(f"gap{i}", created=1 + i / 100))
            self.store.complete_command(f"gap{i}", now=at(1), outcome="already-terminal")
        self.store.submit_command(command("open1", created=2))
        self.store.submit_command(command("open2", created=3))
        assert self.claimed(10, limit=2) == ["open0", "open1"]
        assert self.claimed(10, limit=1) == ["open2"]
        assert self.claimed(10, limit=1) == []
        self.store.complete_command("gap0", now=at(11), outcome="again")  # a retry: harmless
        assert self.claimed(100, limit=3) == ["open0", "open1", "open2"]
        raises(CommandAlreadyExists, self.store.submit_command, command("gap0", created=9))

    def test_validly_leased_commands_never_occupy_the_claim_window(self) -> None:
        for i in range(150):
            self.store.submit_command(command(f"held{i:03}", created=i / 1000))
        assert len(self.claimed(0, lease=60, limit=MAX_CLAIM_LIMIT)) == 150
        self.store.submit_command(command("free", created=1))
        assert self.claimed(1, limit=1) == ["free"]

    def test_a_reclaim_of_an_expired_command_is_leased_from_now(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=10) == ["c1"]
        again = self.store.claim_commands(now=at(100), lease_seconds=10)
        assert again == [replace(command("c1"), lease_until=at(110))]
        assert self.claimed(109) == []
        assert self.claimed(110) == ["c1"]

    def test_a_lease_is_counted_from_the_now_given_not_the_wall_clock(self) -> None:
        far = datetime(2200, 1, 1, tzinfo=timezone.utc)
        self.store.submit_command(command("c1"))
        got = self.store.claim_commands(now=far, lease_seconds=60)
        assert [c.lease_until for c in got] == [far + timedelta(seconds=60)]
        assert self.store.claim_commands(now=far, lease_seconds=60) == []

    def test_release_puts_a_command_back_at_its_original_age(self) -> None:
        self.store.submit_command(command("old", created=0))
        self.store.submit_command(command("young", created=5))
        assert self.claimed(10, limit=1) == ["old"]
        self.store.release_command("old", now=at(20))
        got = self.store.claim_commands(now=at(20), lease_seconds=5, limit=1)
        assert got == [replace(command("old", created=0), lease_until=at(25))]
        assert self.claimed(20) == ["young"]

    def test_release_and_complete_touch_no_other_command_of_the_same_task(self) -> None:
        for i in range(3):
            self.store.submit_command(command(f"c{i}", task_id="t1", created=i))
        assert self.claimed(0, lease=30) == ["c0", "c1", "c2"]
        self.store.release_command("c1", now=at(1))
        assert self.claimed(1) == ["c1"]
        self.store.complete_command("c0", now=at(2))
        assert self.claimed(29) == []
        assert self.claimed(31) == ["c1", "c2"]

    def test_claim_orders_commands_by_microsecond_with_ties_by_command_id(self) -> None:
        base = T0.replace(microsecond=500_000)
        spec = (("d", 3), ("a", 2), ("c", 1), ("b", 1), ("e", 0))
        for command_id, micros in spec:
            self.store.submit_command(
                Command(command_id, "t1", CommandKind.STOP, base + micros * ONE_US)
            )
        assert self.claimed(100, limit=2) == ["e", "b"]
        assert self.claimed(100) == ["c", "a", "d"]

    def test_a_lease_longer_than_the_maximum_is_refused_not_clamped(self) -> None:
        self.store.submit_command(command("c1"))
        for too_long in (MAX_LEASE_SECONDS + 1, MAX_LEASE_SECONDS * 2, 1e12):
            raises(ValueError, self.store.claim_commands, now=at(0), lease_seconds=too_long)
        assert self.claimed(0, lease=1) == ["c1"]
        self.store.release_command("c1", now=at(0))
        got = self.store.claim_commands(now=at(0), lease_seconds=MAX_LEASE_SECONDS)
        assert [c.lease_until for c in got] == [at(MAX_LEASE_SECONDS)]

    def test_a_command_for_an_unknown_or_finished_task_is_stored_as_is(self) -> None:
        self.put(snapshot("done", status=SUCCEEDED))
        unknown = command("c1", task_id="nobody", kind=CommandKind.RESUME, payload={"x": 1})
        finished = command("c2", task_id="done", kind=CommandKind.PAUSE, created=1)
        self.store.submit_command(unknown)
        self.store.submit_command(finished)
        got = self.store.claim_commands(now=at(5), lease_seconds=1)
        assert got == [replace(unknown, lease_until=at(6)), replace(finished, lease_until=at(6))]
        assert self.store.get("nobody") is None
        assert self.counts() == counted(succeeded=1)

    def test_a_command_can_be_completed_after_its_lease_expired_or_unclaimed(self) -> None:
        self.store.submit_command(command("c1"))
        self.store.submit_command(command("c2", created=1))
        assert self.claimed(0, lease=1) == ["c1", "c2"]
        self.store.complete_command("c1", now=at(50))
        assert self.claimed(50) == ["c2"]
        self.store.complete_command("c2", now=at(50))
        assert self.claimed(100) == []

    # -- found by an independent review of the suite (round two) --------------------

    def test_a_finished_command_id_cannot_be_submitted_again(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0) == ["c1"]
        self.store.complete_command("c1", now=at(1))
        raises(CommandAlreadyExists, self.store.submit_command, command("c1", created=5))
        assert self.claimed(100) == []

    def test_complete_refuses_a_bad_outcome_and_leaves_the_command_open(self) -> None:
        self.store.submit_command(command("c1"))
        raises(TypeError, self.store.complete_command, "c1", now=at(1), outcome=5)
        raises(ValueError, self.store.complete_command, "c1", now=at(1), outcome="x" * 1025)
        assert self.claimed(0) == ["c1"]

    def test_a_released_command_is_claimable_by_a_claimer_whose_clock_is_behind(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0, lease=30) == ["c1"]
        self.store.release_command("c1", now=at(20))
        assert self.claimed(10) == ["c1"]
        self.store.submit_command(command("c2", created=1))
        self.store.release_command("c2", now=at(50))  # unleased: left as it is
        assert self.claimed(11) == ["c2"]

    def test_an_ended_lease_a_claim_does_not_take_stays_leased_for_an_earlier_now(self) -> None:
        # A claim whose now ended two leases but whose limit takes one must leave the other as
        # it was: a claimer whose clock is behind (now before that lease's end) cannot take it.
        self.store.submit_command(command("c1", created=0))
        self.store.submit_command(command("c2", created=1))
        assert self.claimed(0, lease=10) == ["c1", "c2"]
        assert self.claimed(20, limit=1) == ["c1"]
        assert self.claimed(5) == []
        again = self.store.claim_commands(now=at(10), lease_seconds=30)
        assert again == [replace(command("c2", created=1), lease_until=at(40))]

    def test_a_refused_release_keeps_the_lease(self) -> None:
        self.store.submit_command(command("c1"))
        assert self.claimed(0) == ["c1"]
        raises(ValueError, self.store.release_command, "c1", now=NAIVE)
        raises(TypeError, self.store.release_command, "c1", now="now")
        assert self.claimed(1) == []

    def test_submit_stores_a_command_as_given(self) -> None:
        self.store.submit_command(command("c1", lease_until=at(50)))
        self.store.submit_command(command("c2", finished_at=at(1), outcome="done"))
        assert self.claimed(10) == []
        assert self.claimed(50) == ["c1"]

    def test_a_lease_shorter_than_a_microsecond_is_refused(self) -> None:
        self.store.submit_command(command("c1"))
        for too_short in (1e-7, 4e-7, 5e-324):
            raises(ValueError, self.store.claim_commands, now=at(0), lease_seconds=too_short)
        got = self.store.claim_commands(now=at(0), lease_seconds=1e-6)
        assert [c.lease_until for c in got] == [at(0) + ONE_US]
        assert self.store.claim_commands(now=at(0), lease_seconds=1) == []
