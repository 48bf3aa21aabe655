"""``counts`` and the audit history (``append``, ``history``)."""

from __future__ import annotations

from chongming_redis import (
    TaskStatus,
)
from chongming_redis.testing.contract.support import (
    FAILED,
    LOST,
    RUNNING,
    SUCCEEDED,
    ContractBase,
    counted,
    raises,
    snapshot,
    transition,
)


class CountsAndHistoryRules(ContractBase):
    # -- counts ------------------------------------------------------------------------------

    def test_counts_of_an_empty_store_has_every_status_at_zero(self) -> None:
        assert self.store.counts() == counted()
        assert set(self.store.counts()) == set(TaskStatus)

    def test_counts_track_create(self) -> None:
        self.put(snapshot("a"), snapshot("b"), snapshot("c", status=RUNNING))
        counts = self.store.counts()
        assert counts == counted(pending=2, running=1)
        assert all(type(n) is int for n in counts.values())

    def test_counts_track_status_changes_by_save(self) -> None:
        self.put(snapshot("a"), snapshot("b"))
        self.store.save(snapshot("a", status=RUNNING, version=2), expect_version=1)
        assert self.store.counts() == counted(pending=1, running=1)
        self.store.save(snapshot("a", status=FAILED, version=3), expect_version=2)
        assert self.store.counts() == counted(pending=1, failed=1)

    def test_counts_track_prune(self) -> None:
        self.put(snapshot("a", status=SUCCEEDED), snapshot("b", status=LOST, created=1))
        self.put(snapshot("c"))
        self.store.prune(keep_terminal=1)
        assert self.store.counts() == counted(pending=1, lost=1)

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
