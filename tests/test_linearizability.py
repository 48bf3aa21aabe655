"""The linearizability checker (``stress/linearizability.py``) with the task model
(``stress/lin_model.py``) on hand-written histories, on histories made by a real sequential
execution (hypothesis), its budget and its minimal example."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chongming_redis.stress import linearizability as lin
from chongming_redis.stress.lin_model import (
    ABSENT,
    OK,
    Conflict,
    Create,
    Exists,
    Read,
    Refused,
    Register,
    Remove,
    Save,
    Start,
    TaskModel,
    Touch,
    TouchFenced,
    render,
)

MODEL = TaskModel()


def op(client: str, invoke: int, ret: int | None, call: Any, outcome: Any = OK) -> lin.Operation:
    return lin.Operation(client, invoke, ret, call, outcome)


def reg(version: int, status: str = "pending", owner: str | None = None) -> Register:
    return Register(version, status, owner)


def verdict(*ops: lin.Operation, budget: int = lin.DEFAULT_BUDGET) -> str:
    return lin.check(list(ops), MODEL, budget=budget, render=render).status


CREATED = op("p", 0, 5, Create(1, "pending", None))


# -- hand-written histories ----------------------------------------------------------------


def test_a_sequential_history_is_linearizable_and_a_changed_read_is_not() -> None:
    history = [CREATED, op("a", 10, 20, Read(), reg(1)), op("a", 30, 40, Save(1, 2, "running")),
               op("b", 50, 60, Read(), reg(2, "running")), op("b", 70, 80, Save(2, 3, "succeeded")),
               op("a", 90, 95, Read(), reg(3, "succeeded"))]  # fmt: skip
    assert verdict(*history) == "linearizable"
    history[3] = op("b", 50, 60, Read(), reg(2, "pending"))  # the status is observed too
    assert verdict(*history) == "violation"


def test_overlapping_operations_may_take_effect_in_either_order() -> None:
    save = op("a", 10, 30, Save(1, 2, "running"))
    for seen in (reg(1), reg(2, "running")):  # a read inside the save's window sees either
        assert verdict(CREATED, save, op("b", 15, 25, Read(), seen)) == "linearizable"
    # ... but not a version nobody wrote, nor the old one after the save returned
    assert verdict(CREATED, save, op("b", 15, 25, Read(), reg(3, "running"))) == "violation"
    assert verdict(CREATED, save, op("b", 31, 40, Read(), reg(1))) == "violation"


def test_a_stale_read_is_a_violation() -> None:
    assert verdict(CREATED, op("a", 10, 20, Save(1, 2, "running")),
                   op("b", 30, 40, Read(), reg(1))) == "violation"  # fmt: skip


def test_a_lost_update_is_a_violation() -> None:
    history = [CREATED, op("a", 10, 20, Save(1, 2, "running")),
               op("b", 30, 40, Save(2, 3, "succeeded"))]  # fmt: skip
    assert verdict(*history, op("c", 50, 60, Read(), reg(3, "succeeded"))) == "linearizable"
    assert verdict(*history, op("c", 50, 60, Read(), reg(2, "running"))) == "violation"


def test_two_successful_compare_and_sets_from_one_version_are_a_violation() -> None:
    one = op("a", 10, 30, Save(1, 2, "running"))
    assert verdict(CREATED, one, op("b", 15, 35, Save(1, 2, "running"))) == "violation"
    assert verdict(CREATED, one, op("b", 15, 35, Save(1, 2, "running"), Conflict(2))) == (
        "linearizable"
    )
    # the start's CAS: two starters from one PENDING version (what a blind start produces)
    start_a, start_b = op("a", 10, 30, Start("A", 2)), op("b", 15, 35, Start("B", 3))
    assert verdict(CREATED, start_a, start_b) == "violation"
    assert verdict(CREATED, start_a, op("c", 40, 45, Read(), reg(2, "running", "A"))) == (
        "linearizable"
    )


def test_unknown_operations_may_have_happened_after_their_invoke_or_never() -> None:
    maybe = op("a", 10, None, Save(1, 2, "running"))
    happened = op("b", 50, 60, Read(), reg(2, "running"))
    never = op("b", 50, 60, Read(), reg(1))
    assert verdict(CREATED, maybe, happened) == "linearizable"  # it must be assumed to happen
    assert verdict(CREATED, maybe, never) == "linearizable"  # or never to have happened
    # ... but not before its invoke, and not undone once seen
    late = op("a", 100, None, Save(1, 2, "running"))
    assert verdict(CREATED, late, happened) == "violation"
    undone = op("b", 70, 80, Read(), reg(1))
    assert verdict(CREATED, maybe, happened, undone) == "violation"
    # a create whose outcome is unknown may explain what a read then sees, or not exist
    assert verdict(op("p", 0, None, Create(1, "pending", None)), op("a", 10, 20, Read(), reg(1)),
                   op("a", 30, 40, Read(), reg(1))) == "linearizable"  # fmt: skip
    gone = op("a", 30, 40, Read(), ABSENT)
    assert verdict(op("p", 0, None, Create(1, "pending", None)),
                   op("a", 10, 20, Read(), reg(1)), gone) == "violation"  # fmt: skip


def test_a_fail_outcome_must_be_what_the_store_held() -> None:
    save = op("a", 10, 20, Save(1, 2, "running"))
    # a conflict after the version moved, reporting the version found: legal
    assert verdict(CREATED, save, op("b", 30, 40, Save(1, 2, "failed"), Conflict(2))) == (
        "linearizable"
    )
    # a conflict while the expected version was stored, or reporting another version: not
    assert verdict(CREATED, op("b", 30, 40, Save(1, 2, "failed"), Conflict(1))) == "violation"
    assert verdict(CREATED, save, op("b", 30, 40, Save(1, 3, "x"), Conflict(7))) == "violation"
    assert verdict(CREATED, op("b", 30, 40, Save(5, 6, "x"), Conflict(None))) == "violation"
    assert verdict(op("b", 30, 40, Save(5, 6, "x"), Conflict(None))) == "linearizable"
    # "already exists" only for a task that exists; a refusal says nothing the model checks
    assert verdict(CREATED, op("b", 10, 20, Create(1, "pending", None), Exists())) == (
        "linearizable"
    )
    assert verdict(op("b", 10, 20, Create(1, "pending", None), Exists())) == "violation"
    assert verdict(op("b", 10, 20, Save(1, 2, "x"), Refused("UniqueTaken"))) == "linearizable"


def test_leases_touches_and_removal() -> None:
    started = [CREATED, op("w", 10, 20, Start("w1", 2))]
    # the fenced touch applies only at its version and writes the owner; a plain touch always
    assert verdict(*started, op("w", 30, 40, TouchFenced(2, "w1"), True),
                   op("w", 50, 60, TouchFenced(1, "w1"), False)) == "linearizable"  # fmt: skip
    assert verdict(*started, op("w", 30, 40, TouchFenced(1, "w1"), True)) == "violation"
    assert verdict(*started, op("w", 30, 40, TouchFenced(2, "w1"), False)) == "violation"
    assert verdict(*started, op("z", 30, 40, Touch("w9")),
                   op("r", 50, 60, Read(), reg(2, "running", "w9"))) == "linearizable"  # fmt: skip
    assert verdict(*started, op("r", 50, 60, Read(), reg(2, "running", "w9"))) == "violation"
    # a save keeps the lease owner; only a final task can be removed
    ended = [*started, op("w", 30, 40, Save(2, 3, "succeeded"))]
    assert verdict(*ended, op("r", 50, 60, Read(), reg(3, "succeeded", "w1"))) == "linearizable"
    assert verdict(*ended, op("x", 50, 60, Remove()), op("r", 70, 80, Read(), ABSENT)) == (
        "linearizable"
    )
    assert verdict(*started, op("x", 50, 60, Remove())) == "violation"


class AtMostOnce:
    """A generic model beside the task model: a flag that may be set once; setting it again is
    illegal whatever the outcome (so an unknown second set can only be one that never ran)."""

    def init(self) -> bool:
        return False

    def step(self, state: bool, call: Any, outcome: Any) -> bool | None:
        return None if state else True


def test_an_unknown_operation_that_is_illegal_everywhere_is_taken_as_never_run() -> None:
    once = op("a", 0, 10, "set")
    assert lin.check([once, op("b", 5, None, "set")], AtMostOnce()).status == "linearizable"
    assert lin.check([once, op("b", 5, 8, "set")], AtMostOnce()).status == "violation"


def test_operations_that_meet_at_one_instant_count_as_concurrent() -> None:
    # the save returned at the very nanosecond the read was invoked: either order is possible
    save = op("a", 10, 20, Save(1, 2, "running"))
    assert verdict(CREATED, save, op("b", 20, 30, Read(), reg(1))) == "linearizable"
    assert verdict(CREATED, save, op("b", 21, 30, Read(), reg(1))) == "violation"


# -- the budget and the example ------------------------------------------------------------


def test_a_search_over_budget_is_unknown_never_a_pass() -> None:
    double = [CREATED, op("a", 10, 30, Save(1, 2, "running")), op("b", 15, 35, Save(1, 2, "x"))]
    found = lin.check(double, MODEL, budget=2)
    assert found.status == "unknown" and not found.ok and "budget" in found.example[0]
    # many concurrent unknown writes and reads: a real search, cut short by a small budget
    crowd = [CREATED] + [op(f"c{i}", 10 + i, None, Save(i % 3 + 1, i % 3 + 2, "x"))
                         for i in range(10)]  # fmt: skip
    crowd.append(op("r", 100, 110, Read(), reg(99)))  # impossible: the search must try all
    assert lin.check(crowd, MODEL, budget=100).status == "unknown"
    assert lin.check(crowd, MODEL, budget=10_000_000).status == "violation"


MS = 1_000_000  # the examples show milliseconds


def _chain(n: int) -> list[lin.Operation]:
    """A create, then ``n`` saves, one every 10 ms."""
    saves = [op("w", 10 * v * MS, (10 * v + 5) * MS, Save(v, v + 1, "running"))
             for v in range(1, n + 1)]  # fmt: skip
    return [op("p", 0, 5 * MS, Create(1, "pending", None)), *saves]


def test_the_example_is_the_earliest_cut_that_cannot_be_linearized() -> None:
    stale = op("r", 95 * MS, 99 * MS, Read(), reg(3, "running"))  # v9 or v10 is stored by then
    after = [op("z", (300 + i) * MS, (305 + i) * MS, Read(), reg(20, "running")) for i in range(5)]
    slow = op("s", 97 * MS, 200 * MS, Read(), reg(20, "running"))  # still running at the cut
    found = lin.check([*_chain(19), stale, slow, *after], MODEL, render=render)
    assert found.status == "violation"
    text = "\n".join(found.example)
    # cut when the stale read returned: the ops invoked by t=99 (create, 9 saves, the reads)
    assert found.example[0] == "the first 12 operations (by invoke) already cannot be linearized:"
    assert (
        "[s] 97.000..? ms  get -> unknown (returned v20 running owner=None after the cut)" in text
    )
    assert "[r] 95.000..99.000 ms  get -> v3 running owner=None" in text
    assert "[z]" not in text  # nothing after the cut
    assert "longest legal order found: 11 of 12 operations, ending in state v10 running" in text
    assert "next could be [r] 95.000..99.000 ms  get -> v3 running owner=None: illegal" in text


def test_an_example_of_a_long_cut_shows_its_latest_operations() -> None:
    late = op("r", 1000 * MS, 1005 * MS, Read(), reg(1))
    found = lin.check([*_chain(59), late], MODEL, render=render)
    assert found.example[1] == f"  ... {61 - lin.EXAMPLE_LINES} earlier operations"
    assert len(found.example) == 2 + lin.EXAMPLE_LINES + 2


# -- histories from a real sequential execution (hypothesis) -------------------------------


@st.composite
def executions(draw: st.DrawFn) -> tuple[list[lin.Operation], list[Register]]:
    """A task's operations as a real sequential register executes them, each at its own
    linearization point (10 ns apart) inside a random real-time window (overlapping its
    neighbours'); some become unknown (their effect kept, or dropped: never happened)."""
    state, ops, states = ABSENT, [], []
    for i in range(draw(st.integers(1, 14))):
        call = draw(_calls(state))
        after = MODEL.step(state, call, lin.UNKNOWN)
        outcome = _observed(state, call, after)
        point = 10 * (i + 1)
        invoke = point - draw(st.integers(0, 25))
        ret = point + draw(st.integers(0, 25))
        fate = draw(st.sampled_from(["known"] * 6 + ["unknown", "never"]))
        if fate == "never" and not isinstance(call, Read):
            ops.append(op(f"c{i}", invoke, None, call))
            continue  # the write never took effect: the state stays
        ops.append(op(f"c{i}", invoke, None if fate == "unknown" else ret, call, outcome))
        assert after is not None
        state = after
        states.append(state)
    return ops, states


def _calls(state: Register) -> st.SearchStrategy[Any]:
    version = state.version or 1
    expect = st.sampled_from([version, version, version - 1, version + 1])
    choices: list[st.SearchStrategy[Any]] = [
        st.just(Read()),
        st.builds(Create, st.just(1), st.sampled_from(["pending", "waiting"]), st.none()),
        st.builds(Save, expect, st.just(version + 1), st.sampled_from(["pending", "failed"])),
        st.builds(TouchFenced, expect, st.sampled_from([None, "w1", "w2"])),
        st.builds(Touch, st.sampled_from(["w1", "w2"])),
    ]  # fmt: skip
    if state.status == "pending":
        choices.append(st.builds(Start, st.sampled_from(["w1", "w2"]), st.just(version + 1)))
    return st.one_of(choices)


def _observed(before: Register, call: Any, after: Register | None) -> Any:
    """What the client of ``call`` sees, run on ``before`` (``after``: the state it leaves)."""
    if isinstance(call, Read):
        return before
    if isinstance(call, TouchFenced):
        return before.version is not None and before.version == call.expect
    if isinstance(call, Create) and before.version is not None:
        return Exists()
    if isinstance(call, Save) and before.version != call.expect:
        return Conflict(before.version)
    return OK


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(executions())
def test_a_real_execution_with_overlapping_windows_is_always_accepted(
    made: tuple[list[lin.Operation], list[Register]],
) -> None:
    ops, _ = made
    assert lin.check(ops, MODEL).status == "linearizable"


@SETTINGS
@given(executions(), st.data())
def test_a_read_of_a_state_that_never_existed_is_always_caught(
    made: tuple[list[lin.Operation], list[Register]], data: st.DataObject
) -> None:
    ops, states = made
    reads = [i for i, o in enumerate(ops) if isinstance(o.call, Read) and o.known]
    if not reads:
        return
    i = data.draw(st.sampled_from(reads))
    impossible = Register(1000, "running", "nobody")  # no execution writes version 1000
    assert impossible not in states
    ops[i] = op(ops[i].client, ops[i].invoke_ns, ops[i].return_ns, Read(), impossible)
    assert lin.check(ops, MODEL).status == "violation"


@SETTINGS
@given(executions(), st.data())
def test_in_a_sequential_history_every_changed_outcome_is_caught(
    made: tuple[list[lin.Operation], list[Register]], data: st.DataObject
) -> None:
    # Windows that do not overlap (each within 4 ns of its point, 10 ns apart): the order is
    # fixed, so a read or a conflict reporting anything but the state then is observable.
    ops = [op(o.client, 10 * (i + 1) - 2, None if o.return_ns is None else 10 * (i + 1) + 2,
              o.call, o.outcome) for i, o in enumerate(made[0])]  # fmt: skip
    if any(not o.known for o in ops):
        return
    observers = [i for i, o in enumerate(ops)
                 if isinstance(o.call, Read) or isinstance(o.outcome, Conflict)]  # fmt: skip
    if not observers:
        return
    i = data.draw(st.sampled_from(observers))
    old = ops[i].outcome
    if isinstance(old, Conflict):
        changed: Any = Conflict((old.actual or 0) + data.draw(st.integers(1, 3)))
    else:
        changed = data.draw(st.sampled_from([ABSENT, reg(1), reg(2, "running", "w1"), reg(3)]))
        if changed == old:
            return
    ops[i] = op(ops[i].client, ops[i].invoke_ns, ops[i].return_ns, ops[i].call, changed)
    assert lin.check(ops, MODEL).status == "violation"
