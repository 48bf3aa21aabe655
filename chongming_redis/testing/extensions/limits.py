"""The contract of ``LimitsStore`` (``stores/extensions.py``): recorded definitions (all or
nothing, a conflict refused unless ``replace``), concurrency never above ``max`` holders per
ref, a slot freed by every write that moves its holder out of ``RUNNING``/``PAUSED``, first come
first served within a ref, no head-of-line blocking, token buckets on the earlier clock, and
``limit_usage``. Mixed into ``ExtensionsContract``; every test returns at once unless the store
is a ``LimitsStore`` and a ``BatchingStore``.

Times are the fixed past instants of ``contract/support.py`` (``at(s)``), so the caller's ``now``
is always the earlier clock and a rate bucket refills deterministically.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chongming_redis.errors import StoreClosed
from chongming_redis.limits import Concurrency, LimitConflict, RateLimit, to_json
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.extensions import BatchingStore, LimitsStore
from chongming_redis.testing.contract.support import (
    FAILED,
    LOST,
    PAUSED,
    PENDING,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    ContractBase,
    at,
    raises,
)

P, R, PA = PENDING, RUNNING, PAUSED
TWO = to_json(Concurrency(max=2, per="customer"))
ONE = to_json(Concurrency(max=1))
RATE = to_json(RateLimit(rate=2, per=1.0, burst=3))
EXP = "exports.per_customer"


def _task(task_id: str, created: float, *refs: str, **fields: Any) -> TaskSnapshot:
    fields.setdefault("updated_at", at(created))
    return TaskSnapshot(task_id, fields.pop("name", "export"), fields.pop("status", P),
                        fields.pop("version", 1), at(created), limits=refs, **fields)  # fmt: skip


class LimitsContract(ContractBase):
    # -- helpers -----------------------------------------------------------------------------

    def _limited(self, *defs: tuple[str, str]) -> Any:
        """The store as a limits-enforcing batching store with ``defs`` recorded, or ``None``."""
        if not isinstance(self.store, LimitsStore) or not isinstance(self.store, BatchingStore):
            return None
        if defs:
            self.store.record_limits(dict(defs), {})
        return self.store

    def _go(self, now: float = 100.0, limit: int = 50, buckets: Any = (0,)) -> list[str]:
        store: Any = self.store
        started = store.start_tasks(owner="w", now=at(now), lease_until=at(now + 30),
                                    buckets=list(buckets), limit=limit)  # fmt: skip
        return [s.task_id for s in started]

    def _move(self, task_id: str, status: TaskStatus, *, commit: bool = False) -> None:
        current = self.store.get(task_id)
        assert current is not None, task_id
        new = replace(current, status=status, status_version=current.status_version + 1)
        if commit:
            store: Any = self.store
            assert store.commit_tasks([(new, current.status_version, [])]) == [None]
        else:
            self.store.save(new, expect_version=current.status_version)

    def _reopen(self, task_id: str) -> None:
        """A retry by hand: the ended task back to ``PENDING``, its next attempt."""
        current = self.store.get(task_id)
        assert current is not None, task_id
        again = replace(current, status=P, status_version=current.status_version + 1,
                        attempt=current.attempt + 1)  # fmt: skip
        self.store.save(again, expect_version=current.status_version)

    def _pending(self, *ids: str) -> None:
        """Each task is still ``PENDING`` as created: version 1, attempt 1, no history."""
        for task_id in ids:
            s = self.store.get(task_id)
            assert s is not None and s.status == P, task_id
            assert (s.status_version, s.attempt) == (1, 1), (task_id, "a refusal wrote the row")
            assert self.store.history(task_id) == [], (task_id, "a refusal appended history")

    # -- definitions -------------------------------------------------------------------------

    def test_record_limits_reads_back_and_refuses_a_conflict_whole(self) -> None:
        if (store := self._limited()) is None:
            return
        store.record_limits({}, {})
        assert store.limit_definitions() == ({}, {}), "empty mappings record nothing"
        defs, types = {EXP: TWO, "api.rate": RATE}, {"export": (EXP, "api.rate"), "sync": ()}
        store.record_limits(defs, types)
        assert store.limit_definitions() == (defs, types)
        store.record_limits(defs, types)
        assert store.limit_definitions() == (defs, types), "the same again changes nothing"
        other = to_json(Concurrency(max=3, per="customer"))
        conflict = raises(LimitConflict, store.record_limits, {"new": ONE, EXP: other},
                          {"export": ["new"], "fresh": ["new"]})  # fmt: skip
        assert conflict.limit_id == EXP
        assert store.limit_definitions() == (defs, types), "a conflict writes nothing at all"
        store.record_limits({EXP: other}, {"export": [EXP]}, replace=True)
        assert store.limit_definitions() == ({**defs, EXP: other}, {**types, "export": (EXP,)})

    def test_record_limits_refuses_bad_input_whole_and_a_closed_store(self) -> None:
        if (store := self._limited()) is None:
            return
        store.record_limits({EXP: TWO}, {"export": [EXP]})
        before = store.limit_definitions()
        bad: list[tuple[type[Exception], Any, Any]] = [
            (ValueError, {"x": "{not json"}, {}),
            (ValueError, {"x": '{"kind":"nope"}'}, {}),
            (ValueError, {"x": ONE}, {"t": ["x", "missing"]}),
            (ValueError, {"x": ONE}, {"t": [f"{EXP}=c1"]}),
            (ValueError, {"x=c1": ONE}, {}),
            (TypeError, {"x": 3}, {}),
            (TypeError, {"x": ONE}, {"t": "x"}),
            (TypeError, [("x", ONE)], {}),
        ]
        for error, definitions, task_limits in bad:
            raises(error, store.record_limits, definitions, task_limits)
            assert store.limit_definitions() == before, (definitions, task_limits)
        for value in (0, 10_001):
            raises(ValueError, store.limit_usage, limit=value)
        self.close_store()
        raises(StoreClosed, store.record_limits, {"y": ONE}, {})
        raises(StoreClosed, store.limit_definitions)
        raises(StoreClosed, store.limit_usage)

    # -- concurrency -------------------------------------------------------------------------

    def test_concurrency_never_admits_more_than_max_per_key(self) -> None:
        if self._limited((EXP, TWO)) is None:
            return
        self.put(*(_task(f"a{i}", i, f"{EXP}=c1") for i in range(5)))
        self.put(_task("b0", 10, f"{EXP}=c2"), _task("b1", 11, f"{EXP}=c2"))
        assert self._go(limit=100) == ["a0", "a1", "b0", "b1"]
        self._pending("a2", "a3", "a4")
        for n in range(3):
            assert self._go(now=101 + n, limit=100) == [], "a full key starts none more"
        self._pending("a2", "a3", "a4")
        assert self.store.counts()[R] == 4

    def test_every_way_out_of_running_frees_the_slot_in_that_write(self) -> None:
        if self._limited((EXP, TWO)) is None:
            return
        self.put(*(_task(f"a{i}", i, f"{EXP}=c1") for i in range(8)))
        assert self._go() == ["a0", "a1"]
        running = ["a0", "a1"]
        ways = [(SUCCEEDED, True), (FAILED, True), (FAILED, False), (STOPPED, False),
                (LOST, False), (P, False)]  # fmt: skip
        for n, (status, commit) in enumerate(ways):
            self._move(running.pop(0), status, commit=commit)
            started = self._go(now=101 + n)
            assert len(started) == 1, (status, commit, "frees exactly one slot", started)
            running.append(started[0])
            assert self._go(now=101 + n) == [], "and no more"

    def test_paused_keeps_its_slot_and_a_created_holder_takes_one_pool_wide(self) -> None:
        if self._limited((EXP, TWO)) is None:
            return
        self.put(_task("held", 0, f"{EXP}=c1", status=R, version=2, bucket=3))
        self.put(*(_task(f"a{i}", 1 + i, f"{EXP}=c1") for i in range(3)))
        assert self._go() == ["a0"], "a task created RUNNING in another bucket holds a slot"
        self._move("a0", PA)
        assert self._go(now=101) == [], "PAUSED keeps its slot"
        self._move("held", PA)
        assert self._go(now=102, buckets=[0, 3]) == []
        self._move("held", SUCCEEDED)
        assert self._go(now=103) == ["a1"]

    def test_a_freed_slot_goes_to_the_oldest_waiter_and_other_keys_go_on(self) -> None:
        if self._limited((EXP, to_json(Concurrency(max=1, per="c")))) is None:
            return
        self.put(_task("h", 0, f"{EXP}=k"))
        assert self._go() == ["h"]
        self.put(_task("w1", 1, f"{EXP}=k"), _task("w2", 2, f"{EXP}=k"))
        assert self._go(now=101) == []
        self.put(_task("w3", 3, f"{EXP}=k"), _task("other", 4, f"{EXP}=j"), _task("free", 5))
        self._move("h", SUCCEEDED)
        assert self._go(now=102, limit=2) == ["w1", "other"], "the first refused goes first"
        assert self._go(now=103) == ["free"]
        self._move("w1", SUCCEEDED)
        assert self._go(now=104) == ["w2"], "then the next refused, before the later one"
        self._move("w2", SUCCEEDED)
        assert self._go(now=105) == ["w3"]

    def test_a_flooded_ref_holds_back_nothing_outside_it(self) -> None:
        if self._limited((EXP, TWO)) is None:
            return
        self.put(*(_task(f"h{i}", 0, f"{EXP}=hot", status=R, version=2) for i in range(2)))
        self.put(*(_task(f"f{i:03}", 1 + i / 1000, f"{EXP}=hot") for i in range(300)))
        free = [_task(f"free{i}", 10 + i) for i in range(5)]
        cold = [_task(f"cold{i}", 20 + i, f"{EXP}=cold") for i in range(5)]
        self.put(*free, *cold)
        started = self._go(limit=8) + self._go(now=101, limit=8)
        assert sorted(started) == sorted([f"free{i}" for i in range(5)] + ["cold0", "cold1"])
        assert self._go(now=102, limit=8) == []
        assert self.store.counts()[P] == 303

    def test_a_task_its_limit_refuses_hides_no_better_task_of_another_type(self) -> None:
        """A refused head is passed over within the call, and what starts is the best of the
        rest, whatever type's queue it waits in: never a worse task of the refused head's
        neighbour queue before a better one of another type."""
        if self._limited(("api.slow", to_json(RateLimit(rate=1, per=60.0, burst=1)))) is None:
            return
        self.put(_task("spent", 0, "api.slow"))
        assert self._go(limit=1) == ["spent"]  # the bucket's one token: none left at now=100
        # "refused" is the best of all (priority 5) and its rate limit refuses it (a head that
        # does not start); "a2" waits behind "a1" in alpha's queue, "b1" alone in beta's.
        self.put(_task("refused", 1, "api.slow", priority=5),
                 _task("a1", 2, name="alpha", priority=3),
                 _task("a2", 3, name="alpha", priority=-5),
                 _task("b1", 4, name="beta"))  # fmt: skip
        assert sorted(self._go(limit=2)) == ["a1", "b1"]
        assert self._go(limit=2) == ["a2"]
        self._pending("refused")

    # -- rate --------------------------------------------------------------------------------

    def test_a_rate_limit_spends_one_token_per_start_on_the_earlier_clock(self) -> None:
        if self._limited(("api.rate", RATE)) is None:
            return
        self.put(*(_task(f"r{i}", i / 10, "api.rate") for i in range(10)))
        assert self._go(now=0) == ["r0", "r1", "r2"], "a full bucket: burst starts"
        assert self._go(now=0.25) == [], "half a token is none"
        assert self._go(now=0.5) == ["r3"]
        assert self._go(now=0.5) == [], "a token is spent once"
        assert self._go(now=0.2) == [], "a clock going back gives nothing"
        assert self._go(now=1.0) == ["r4"], "and counts nothing twice"
        assert self._go(now=2.0, limit=1) == ["r5"], "two tokens, one spent"
        assert self._go(now=1.5) == ["r6"], "the one left, spent on an earlier clock"
        assert self._go(now=2.0) == [], "the time up to the later moment is not refilled again"
        assert self._go(now=10.0) == ["r7", "r8", "r9"], "refilled up to burst"

    # -- usage and the rest ------------------------------------------------------------------

    def test_limit_usage_counts_holders_and_live_waiters_busiest_first(self) -> None:
        if (store := self._limited((EXP, to_json(Concurrency(max=1, per="c"))))) is None:
            return
        assert store.limit_usage() == []
        self.put(*(_task(f"a{i}", i, f"{EXP}=z") for i in range(4)))  # busiest, last by name
        self.put(*(_task(f"b{i}", 10 + i, f"{EXP}=m") for i in range(2)))
        self.put(_task("c0", 20, f"{EXP}=c"))
        assert self._go() == ["a0", "b0", "c0"]
        usage = [(u.ref, u.held, u.waiting) for u in store.limit_usage()]
        assert usage == [(f"{EXP}=z", 1, 3), (f"{EXP}=m", 1, 1), (f"{EXP}=c", 1, 0)]
        assert [u.ref for u in store.limit_usage(limit=1)] == [f"{EXP}=z"]
        assert store.limit_usage()[0].limit_id == EXP
        self._move("a3", STOPPED)  # a waiter that left PENDING is not one, nor when it is
        self._reopen("a3")  # retried back to PENDING until a start passes it over again
        self._move("c0", SUCCEEDED)  # a ref with neither holder nor waiter is gone
        usage = [(u.ref, u.held, u.waiting) for u in store.limit_usage(limit=10_000)]
        assert usage == [(f"{EXP}=z", 1, 2), (f"{EXP}=m", 1, 1)]
        self._move("a0", SUCCEEDED)
        self._move("b0", SUCCEEDED)
        assert self._go(now=101) == ["a1", "b1"]
        usage = [(u.ref, u.held, u.waiting) for u in store.limit_usage()]
        assert usage == [(f"{EXP}=z", 1, 2), (f"{EXP}=m", 1, 0)], "started waiters are not"

    def test_an_unrecorded_limit_limits_nothing_and_a_lower_max_evicts_no_holder(self) -> None:
        if (store := self._limited((EXP, TWO))) is None:
            return
        self.put(*(_task(f"u{i}", i, "nobody.recorded=x") for i in range(3)))
        self.put(*(_task(f"a{i}", 10 + i, f"{EXP}=c1") for i in range(4)))
        assert self._go() == ["u0", "u1", "u2", "a0", "a1"]
        store.record_limits({EXP: to_json(Concurrency(max=1, per="customer"))}, {}, replace=True)
        assert self.store.get("a0").status == R and self.store.get("a1").status == R  # type: ignore[union-attr]
        self._move("a0", SUCCEEDED)
        assert self._go(now=101) == [], "one holder left is not below the new max"
        self._move("a1", SUCCEEDED)
        assert self._go(now=102) == ["a2"]

    def test_a_task_with_two_refs_starts_when_both_allow_and_a_refusal_spends_nothing(
        self,
    ) -> None:
        store = self._limited((EXP, to_json(Concurrency(max=1, per="c"))), ("api.rate", RATE))
        if store is None:
            return
        both = ("api.rate", f"{EXP}=k")
        self.put(_task("x0", 0, *both), _task("x1", 1, *both), _task("x2", 2, *both))
        assert self._go(now=0) == ["x0"], "the key is full after one"
        assert self._go(now=0) == []
        self.put(_task("r0", 5, "api.rate"), _task("r1", 6, "api.rate"))
        assert self._go(now=0) == ["r0", "r1"], "refusals by the key spent no token"
        self._move("x0", SUCCEEDED)
        assert self._go(now=0) == [], "the key has room, the bucket none"
        assert self._go(now=0.5) == ["x1"]
        held = {u.ref: u.held for u in store.limit_usage()}
        assert held.get("api.rate", 0) == 0 and held[f"{EXP}=k"] == 1, "a rate ref holds nothing"
