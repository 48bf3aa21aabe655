"""``counts`` and the audit history (``append``, ``history``)."""

from __future__ import annotations

from dataclasses import replace

from chongming_redis import (
    ConcurrencyConflict,
    Progress,
    TaskAlreadyExists,
    TaskStatus,
)
from chongming_redis.testing.contract.support import (
    CORE_STATUSES,
    FAILED,
    LOST,
    RUNNING,
    SUCCEEDED,
    ContractBase,
    at,
    command,
    counted,
    raises,
    snapshot,
    transition,
)


class CountsAndHistoryRules(ContractBase):
    # -- counts ------------------------------------------------------------------------------

    def test_counts_of_an_empty_store_has_every_status_at_zero(self) -> None:
        assert self.counts() == counted()
        assert set(CORE_STATUSES) <= set(self.store.counts()) <= set(TaskStatus)

    def test_counts_track_create(self) -> None:
        self.put(snapshot("a"), snapshot("b"), snapshot("c", status=RUNNING))
        counts = self.store.counts()
        assert counts == counted(pending=2, running=1)
        assert all(type(n) is int for n in counts.values())

    def test_counts_track_status_changes_by_save(self) -> None:
        self.put(snapshot("a"), snapshot("b"))
        self.store.save(snapshot("a", status=RUNNING, version=2), expect_version=1)
        assert self.counts() == counted(pending=1, running=1)
        self.store.save(snapshot("a", status=FAILED, version=3), expect_version=2)
        assert self.counts() == counted(pending=1, failed=1)

    def test_counts_track_prune(self) -> None:
        self.put(snapshot("a", status=SUCCEEDED), snapshot("b", status=LOST, created=1))
        self.put(snapshot("c"))
        self.store.prune(keep_terminal=1)
        assert self.counts() == counted(pending=1, lost=1)

    # -- history -----------------------------------------------------------------------------

    def test_history_is_ascending_by_version_whatever_the_append_order(self) -> None:
        self.put(snapshot("t1"))
        for version in (3, 1, 10, 2):
            self.store.append(transition("t1", version))
        assert [t.version for t in self.store.history("t1")] == [1, 2, 3, 10]

    def test_append_is_idempotent_on_task_and_version(self) -> None:
        self.put(snapshot("t1"))
        entries = [transition("t1", v) for v in (1, 2, 3)]
        for entry in entries + entries + entries[1:]:
            self.store.append(entry)
        assert self.store.history("t1") == entries

    def test_replaying_an_entry_with_different_content_keeps_the_first(self) -> None:
        self.put(snapshot("t1"))
        first = transition("t1", 2, reason="first")
        self.store.append(first)
        self.store.append(transition("t1", 2, reason="second"))
        self.store.append(transition("t1", 2, to=FAILED, reason=None))
        assert self.store.history("t1") == [first]

    def test_history_since_version_returns_only_later_entries(self) -> None:
        self.put(snapshot("t1"))
        entries = [transition("t1", v) for v in (1, 2, 4, 7)]
        for entry in entries:
            self.store.append(entry)
        assert self.store.history("t1", since_version=0) == entries
        assert self.store.history("t1", since_version=1) == entries[1:]
        assert self.store.history("t1", since_version=2) == entries[2:]
        assert self.store.history("t1", since_version=3) == entries[2:]
        assert self.store.history("t1", since_version=6) == entries[3:]
        assert self.store.history("t1", since_version=7) == []
        assert self.store.history("t1", since_version=100) == []
        raises(TypeError, self.store.history, "t1", since_version=True)
        raises(ValueError, self.store.history, "t1", since_version=-1)

    def test_history_of_an_unknown_task_is_empty(self) -> None:
        assert self.store.history("nobody") == []
        assert self.store.history("nobody", since_version=3) == []

    def test_history_is_kept_per_task(self) -> None:
        self.put(snapshot("a"), snapshot("b"), snapshot("ab"))
        self.store.append(transition("a", 1, reason="a"))
        self.store.append(transition("b", 1, reason="b"))
        assert self.store.history("a") == [transition("a", 1, reason="a")]
        assert self.store.history("b") == [transition("b", 1, reason="b")]
        assert self.store.history("ab") == []

    # -- counters over several items and repeated calls (round two) --------------------------

    def test_counts_do_not_move_on_a_save_that_keeps_the_status(self) -> None:
        self.put(snapshot("a", status=RUNNING), snapshot("b", status=RUNNING, created=1))
        self.put(snapshot("c", created=2))
        for version in (2, 3, 7):
            self.store.save(snapshot("a", status=RUNNING, version=version, bucket=version),
                            expect_version={2: 1, 3: 2, 7: 3}[version])  # fmt: skip
            assert self.counts() == counted(running=2, pending=1), version
        assert self.store.counts() == self.store.counts()

    def test_counts_do_not_move_on_a_refused_create_or_save(self) -> None:
        self.put(snapshot("a"), snapshot("b", status=FAILED, created=1))
        for status in CORE_STATUSES:
            raises(TaskAlreadyExists, self.store.create, snapshot("a", status=status, bucket=9))
            raises(TaskAlreadyExists, self.store.create, snapshot("b", status=status))
        assert self.counts() == counted(pending=1, failed=1)
        assert self.where(buckets={9}) == [] and self.where(statuses={RUNNING}) == []
        raises(ConcurrencyConflict, self.store.save, snapshot("a", status=LOST, version=5),
               expect_version=4)  # fmt: skip
        raises(ConcurrencyConflict, self.store.save, snapshot("zz", status=LOST, version=5),
               expect_version=4)  # fmt: skip
        assert self.counts() == counted(pending=1, failed=1)

    def test_counts_after_pruning_several_tasks_of_one_status_at_once(self) -> None:
        self.put(*(snapshot(f"s{i}", status=SUCCEEDED, created=i) for i in range(5)))
        self.put(*(snapshot(f"f{i}", status=FAILED, created=10 + i) for i in range(2)))
        self.put(snapshot("live", status=RUNNING, created=-5))
        assert self.store.prune(keep_terminal=3) == 4
        assert self.counts() == counted(failed=2, succeeded=1, running=1)
        assert self.ids() == ["live", "s4", "f0", "f1"]
        assert self.store.prune(keep_terminal=0) == 3
        assert self.counts() == counted(running=1)
        assert self.store.prune(keep_terminal=0) == 0
        assert self.counts() == counted(running=1)

    def test_counts_do_not_move_on_touch_or_commands(self) -> None:
        self.put(snapshot("a", status=RUNNING), snapshot("b", created=1))
        self.store.touch("a", progress=Progress(1), heartbeat_at=at(1), lease_owner="w",
                         lease_until=at(2))  # fmt: skip
        self.store.touch("ghost", heartbeat_at=at(1))
        self.store.submit_command(command("c1", task_id="a"))
        self.store.claim_commands(now=at(0), lease_seconds=5)
        self.store.complete_command("c1", now=at(1))
        self.store.append(transition("a", 9))
        assert self.counts() == counted(running=1, pending=1)

    def test_counts_equal_what_query_finds_after_a_mix_of_writes(self) -> None:
        statuses = list(CORE_STATUSES)
        for i in range(21):
            self.put(snapshot(f"t{i}", status=statuses[i % len(statuses)], created=i))
        for i in range(0, 21, 3):
            current = self.store.get(f"t{i}")
            assert current is not None
            moved = replace(current, status=statuses[(i + 2) % len(statuses)], status_version=2)
            self.store.save(moved, expect_version=1)
        self.store.prune(keep_terminal=4)
        by_query = {s: len(self.where(statuses={s})) for s in TaskStatus}
        assert self.counts() == by_query
        assert sum(by_query.values()) == len(self.ids())

    # -- history: identity (round two) -------------------------------------------------------

    def test_an_id_reused_after_prune_starts_an_empty_history_that_accepts_appends(self) -> None:
        self.put(snapshot("t1", status=FAILED))
        old = [transition("t1", v, reason="old") for v in (1, 2, 3)]
        for entry in old:
            self.store.append(entry)
        assert self.store.prune(keep_terminal=0) == 1
        self.put(snapshot("t1", created=5))
        assert self.store.history("t1") == []
        new = [transition("t1", v, reason="new") for v in (1, 2)]
        for entry in new:
            self.store.append(entry)
        assert self.store.history("t1") == new
        assert self.store.history("t1", since_version=1) == new[1:]

    # -- found by an independent review of the suite (round two) --------------------

    def test_counts_are_keyed_by_task_status(self) -> None:
        self.put(snapshot("t1"))
        assert all(type(k) is TaskStatus for k in self.store.counts())
