"""``prune`` and ``close``."""

from __future__ import annotations

from collections.abc import Callable

from chongming_redis import (
    Progress,
    TaskQuery,
)
from chongming_redis.stores.protocol import PROTOCOL_METHODS
from chongming_redis.testing.contract.support import (
    FAILED,
    LIVE,
    LOST,
    MAX,
    ONE_US,
    PAUSED,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    T0,
    TERMINAL,
    ContractBase,
    at,
    command,
    counted,
    outcome_of,
    raises,
    snapshot,
    transition,
)


class OperationRules(ContractBase):
    # -- prune -------------------------------------------------------------------------------

    def test_prune_keeps_the_newest_terminal_tasks_and_drops_the_oldest(self) -> None:
        created = {"t3": 3, "t1": 1, "t5": 5, "t2": 2, "t4": 4}
        self.put(*(snapshot(i, status=SUCCEEDED, created=c) for i, c in created.items()))
        assert self.store.prune(keep_terminal=2) == 3
        assert self.ids() == ["t4", "t5"]
        assert self.store.get("t1") is None

    def test_prune_decides_by_created_at_not_updated_at(self) -> None:
        self.put(
            snapshot("old", status=FAILED, created=1, updated_at=at(100)),
            snapshot("new", status=FAILED, created=2, updated_at=at(2)),
        )
        assert self.store.prune(keep_terminal=1) == 1
        assert self.ids() == ["new"]

    def test_prune_drops_the_history_of_dropped_tasks_only(self) -> None:
        self.put(
            snapshot("old", status=STOPPED, created=1), snapshot("new", status=LOST, created=2)
        )
        self.put(snapshot("live", created=0))
        for task_id in ("old", "new", "live"):
            self.store.append(transition(task_id, 1))
            self.store.append(transition(task_id, 2))
        assert self.store.prune(keep_terminal=1) == 1
        assert self.store.history("old") == []
        assert self.store.history("new") == [transition("new", 1), transition("new", 2)]
        assert self.store.history("live") == [transition("live", 1), transition("live", 2)]

    def test_prune_never_drops_a_live_task(self) -> None:
        self.put(*(snapshot(s.value, status=s, created=-100 + i) for i, s in enumerate(LIVE)))
        self.put(snapshot("done", status=SUCCEEDED, created=50))
        assert self.store.prune(keep_terminal=0) == 1
        assert self.ids() == ["pending", "running", "paused"]
        assert self.store.prune(keep_terminal=0) == 0
        assert self.ids() == ["pending", "running", "paused"]

    def test_prune_counts_only_terminal_tasks_toward_keep_terminal(self) -> None:
        self.put(snapshot("a", status=FAILED, created=1), snapshot("b", status=FAILED, created=2))
        self.put(*(snapshot(f"live{i}", status=RUNNING, created=10 + i) for i in range(3)))
        assert self.store.prune(keep_terminal=2) == 0
        assert len(self.ids()) == 5

    def test_prune_treats_every_terminal_status_as_terminal(self) -> None:
        self.put(*(snapshot(s.value, status=s, created=i) for i, s in enumerate(TERMINAL)))
        self.put(snapshot("live", status=PAUSED, created=-1))
        assert self.store.prune(keep_terminal=0) == len(TERMINAL)
        assert self.ids() == ["live"]

    def test_prune_with_keep_terminal_at_or_above_the_count_drops_nothing(self) -> None:
        assert self.store.prune(keep_terminal=0) == 0
        assert self.store.prune(keep_terminal=10) == 0
        self.put(snapshot("a", status=FAILED), snapshot("b", status=LOST, created=1))
        assert self.store.prune(keep_terminal=2) == 0
        assert self.store.prune(keep_terminal=1000) == 0
        assert self.ids() == ["a", "b"]

    def test_prune_refuses_a_negative_or_bool_keep_terminal(self) -> None:
        self.put(snapshot("a", status=FAILED))
        raises(ValueError, self.store.prune, keep_terminal=-1)
        raises(TypeError, self.store.prune, keep_terminal=True)
        assert self.ids() == ["a"]

    def test_a_pruned_id_can_be_created_again(self) -> None:
        self.put(snapshot("t1", status=FAILED))
        self.store.append(transition("t1", 1))
        assert self.store.prune(keep_terminal=0) == 1
        self.put(snapshot("t1", created=5))
        assert self.store.get("t1") == snapshot("t1", created=5)
        assert self.store.history("t1") == []

    # -- close -------------------------------------------------------------------------------

    def test_close_is_idempotent(self) -> None:
        self.close_store()
        self.store.close()
        self.store.close()

    def test_every_method_after_close_raises_store_closed(self) -> None:
        self.put(snapshot("t1"))
        self.store.submit_command(command("c1"))
        self.close_store()
        calls: dict[str, Callable[[], object]] = {
            "create": lambda: self.store.create(snapshot("t2")),
            "save": lambda: self.store.save(snapshot("t1", version=2), expect_version=1),
            "get": lambda: self.store.get("t1"),
            "query": lambda: self.store.query(),
            "counts": lambda: self.store.counts(),
            "append": lambda: self.store.append(transition("t1", 1)),
            "history": lambda: self.store.history("t1"),
            "touch": lambda: self.store.touch("t1", heartbeat_at=at(1)),
            "submit_command": lambda: self.store.submit_command(command("c2")),
            "claim_commands": lambda: self.store.claim_commands(now=at(0), lease_seconds=1),
            "complete_command": lambda: self.store.complete_command("c1", now=at(0)),
            "release_command": lambda: self.store.release_command("c1", now=at(0)),
            "prune": lambda: self.store.prune(keep_terminal=0),
        }
        assert set(calls) == set(PROTOCOL_METHODS) - {"close"}
        wrong = {name: outcome_of(call) for name, call in calls.items()}
        wrong = {name: outcome for name, outcome in wrong.items() if outcome != "StoreClosed"}
        assert not wrong, f"after close() these did not raise StoreClosed: {wrong}"

    # -- prune order (round two) -------------------------------------------------------------

    def test_prune_breaks_created_at_ties_by_task_id(self) -> None:
        self.put(*(snapshot(i, status=FAILED, created=1) for i in ("c", "a", "d", "b")))
        self.put(snapshot("0", status=FAILED, created=2))
        assert self.store.prune(keep_terminal=3) == 2
        assert self.ids() == ["c", "d", "0"]
        assert self.store.prune(keep_terminal=1) == 2
        assert self.ids() == ["0"]

    def test_prune_orders_by_the_instant_to_the_microsecond(self) -> None:
        self.put(
            snapshot("b-later", status=LOST, created_at=T0 + ONE_US, updated_at=T0),
            snapshot("z-earlier", status=LOST, created_at=T0, updated_at=T0 + ONE_US),
        )
        assert self.store.prune(keep_terminal=1) == 1
        assert self.ids() == ["b-later"]

    def test_prune_of_many_drops_each_history_and_index_entry(self) -> None:
        for i in range(30):
            self.put(snapshot(f"t{i:02}", status=SUCCEEDED, created=i, tags={"io"}, bucket=i % 3,
                              name="etl", pipeline_run_id="p"))  # fmt: skip
            self.store.append(transition(f"t{i:02}", 1))
        assert self.store.prune(keep_terminal=5) == 25
        kept = [f"t{i:02}" for i in range(25, 30)]
        assert self.where(tag="io") == kept and self.where(name="etl") == kept
        assert self.where(pipeline_run_id="p") == kept and self.where(name_prefix="e") == kept
        assert sorted(self.where(buckets={0, 1, 2})) == kept
        assert [len(self.store.history(f"t{i:02}")) for i in range(30)] == [0] * 25 + [1] * 5
        assert self.counts() == counted(succeeded=5)

    # -- found by an independent review of the suite (round two) --------------------

    def test_prune_returns_an_int(self) -> None:
        assert type(self.store.prune(keep_terminal=0)) is int
        self.put(snapshot("t1", status=SUCCEEDED))
        n = self.store.prune(keep_terminal=0)
        assert n == 1 and type(n) is int

    def test_a_pruned_then_recreated_task_carries_nothing_of_the_old_one(self) -> None:
        self.put(snapshot("t1", status=SUCCEEDED))
        self.store.touch(
            "t1", progress=Progress(1), heartbeat_at=at(1), lease_owner="w", lease_until=at(2)
        )
        self.store.append(transition("t1", 1))
        assert self.store.prune(keep_terminal=0) == 1
        fresh = snapshot("t1", created=5)
        self.store.create(fresh)
        assert self.store.get("t1") == fresh
        assert self.store.history("t1") == []

    def test_prune_decides_by_the_current_status(self) -> None:
        self.put(snapshot("t1", status=LOST))
        self.store.save(snapshot("t1", status=RUNNING, version=2), expect_version=1)
        assert self.store.prune(keep_terminal=0) == 0
        assert self.ids() == ["t1"]

    def test_calls_that_need_no_data_still_raise_store_closed(self) -> None:
        self.put(snapshot("t1"))
        self.close_store()
        calls = {
            "touch nothing": lambda: self.store.touch("t1"),
            "touch ghost": lambda: self.store.touch("ghost", heartbeat_at=at(1)),
            "query limit 0": lambda: self.store.query(TaskQuery(limit=0)),
            "query no statuses": lambda: self.store.query(TaskQuery(statuses=frozenset())),
            "query no buckets": lambda: self.store.query(TaskQuery(buckets=frozenset())),
            "get missing": lambda: self.store.get("missing"),
            "history missing": lambda: self.store.history("missing"),
            "history max": lambda: self.store.history("t1", since_version=MAX),
            "complete unknown": lambda: self.store.complete_command("nope", now=at(0)),
            "release unknown": lambda: self.store.release_command("nope", now=at(0)),
            "prune max": lambda: self.store.prune(keep_terminal=MAX),
        }
        wrong = {k: outcome_of(c) for k, c in calls.items()}
        wrong = {k: v for k, v in wrong.items() if v != "StoreClosed"}
        assert not wrong, wrong
