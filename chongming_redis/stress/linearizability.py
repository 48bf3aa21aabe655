"""A linearizability checker: Wing & Gong's search with Lowe's memoization (the "WGL" of
Knossos, Porcupine's ``checkSingle``), for one history of one object.

A history is a list of :class:`Operation`: a client's call with its real-time bounds (invoke and
return, monotonic nanoseconds) and the outcome the client saw. It is *linearizable* for a
sequential ``Model`` when some total order of the operations (a) respects real time: an operation
that returned before another was invoked comes first, and (b) replays in the model, each step
legal with the outcome observed. An operation whose outcome is unknown (the connection dropped,
a timeout, the process died: ``return_ns is None``) may take effect at any point after its
invoke, or never, as in Knossos and Porcupine (its return is at infinity and the search may drop
it).

The search (Lowe, "Testing for linearizability", 2017, section 4; Porcupine): the call and
return events in time order in a doubly linked list; walk it, and at a call try the operation on
the current state: if legal and the pair (set of operations linearized, new state) was never
reached before, lift the operation out of the list and go on from the head; at a return whose
operation is not yet linearized, backtrack to the last choice. The memo of (bit set, state)
pairs bounds the work by the distinct configurations, not by the orderings.

Linearizability is local (Herlihy & Wing's P-compositionality): a history of many independent
objects is linearizable iff each object's sub-history is, so callers split by object (per task)
and check each alone, which keeps every search small.

A search that takes more than ``budget`` model steps stops with ``"unknown"``: never a pass. A
violation comes with a minimal example: the earliest cut of the history in time (the operations
invoked before it; those not yet returned become unknown) that already cannot be linearized —
sound, since a linearizable history has a linearizable cut at every instant — with the longest
order the search found and why no remaining operation can follow it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

S = TypeVar("S", bound=Hashable)

#: Model steps one search may take before it gives up with ``"unknown"``.
DEFAULT_BUDGET = 200_000
#: Operations an example shows at most (the latest ones before the cut).
EXAMPLE_LINES = 30


class _Unknown:
    """The outcome of an operation whose client never learned it."""

    def __repr__(self) -> str:
        return "unknown"


UNKNOWN: Any = _Unknown()


@dataclass(frozen=True)
class Operation:
    """One call as its client saw it. ``return_ns is None``: the outcome is unknown (and
    ``outcome`` is ignored)."""

    client: str
    invoke_ns: int
    return_ns: int | None
    call: Any
    outcome: Any = None

    def __post_init__(self) -> None:
        if self.return_ns is not None and self.return_ns < self.invoke_ns:
            raise ValueError(f"operation returns before its invoke: {self}")

    @property
    def known(self) -> bool:
        return self.return_ns is not None

    @property
    def seen(self) -> Any:
        """The outcome the model is given: ``UNKNOWN`` for an unknown operation."""
        return self.outcome if self.known else UNKNOWN


class Model(Protocol[S]):
    """A sequential specification. ``step`` returns the state after ``call`` with ``outcome``
    (``UNKNOWN``: whatever the call would do), or ``None`` when that outcome is impossible."""

    def init(self) -> S: ...

    def step(self, state: S, call: Any, outcome: Any) -> S | None: ...


Status = Literal["linearizable", "violation", "unknown"]


@dataclass(frozen=True)
class Verdict:
    status: Status
    steps: int
    #: readable lines: for a violation the minimal example, for "unknown" why
    example: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "linearizable"


@dataclass(frozen=True)
class _Search(Generic[S]):
    status: Status
    steps: int
    best: tuple[int, ...] = ()  # the longest order of operation indexes the search built
    best_state: S | None = None


class _Entry:
    """A call or a return event in the search's linked list."""

    __slots__ = ("is_call", "match", "next", "op", "prev")

    def __init__(self, op: int, is_call: bool) -> None:
        self.op = op
        self.is_call = is_call
        self.prev: _Entry | None = None
        self.next: _Entry | None = None
        self.match: _Entry | None = None  # a call's return event


def _event_list(ops: Sequence[Operation]) -> _Entry:
    """The head of the list of every call and return in time order. At equal times a call
    comes before a return: the two operations count as concurrent (never a false violation)."""
    infinity = max((op.return_ns or op.invoke_ns for op in ops), default=0) + 1
    events = []
    for i, op in enumerate(ops):
        events.append((op.invoke_ns, 0, i))
        events.append((infinity if op.return_ns is None else op.return_ns, 1, i))
    events.sort()
    head = _Entry(-1, False)
    last, calls = head, {}
    for _, kind, i in events:
        entry = _Entry(i, kind == 0)
        if entry.is_call:
            calls[i] = entry
        else:
            calls[i].match = entry
        entry.prev, last.next, last = last, entry, entry
    return head


def _lift(call: _Entry) -> None:
    ret = call.match
    assert call.prev is not None and call.next is not None and ret is not None
    assert ret.prev is not None
    call.prev.next, call.next.prev = call.next, call.prev
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(call: _Entry) -> None:
    ret = call.match
    assert call.prev is not None and call.next is not None and ret is not None
    assert ret.prev is not None
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    call.prev.next = call
    call.next.prev = call


def _search(ops: Sequence[Operation], model: Model[S], budget: int) -> _Search[S]:
    head = _event_list(ops)
    state = model.init()
    linearized = 0
    stack: list[tuple[_Entry, S]] = []
    seen: set[tuple[int, S]] = set()
    best: tuple[tuple[int, ...], S] = ((), state)
    steps = 0
    entry = head.next
    while entry is not None:
        if entry.is_call:
            if steps >= budget:
                return _Search("unknown", steps)
            steps += 1
            op = ops[entry.op]
            after = model.step(state, op.call, op.seen)
            if after is not None:
                key = (linearized | (1 << entry.op), after)
                if key not in seen:
                    seen.add(key)
                    stack.append((entry, state))
                    state, linearized = after, key[0]
                    _lift(entry)
                    if len(stack) > len(best[0]):
                        best = (tuple(e.op for e, _ in stack), state)
                    entry = head.next
                    continue
            entry = entry.next
        elif not ops[entry.op].known:
            break  # only unknown operations' returns are left: each may never have happened
        elif not stack:
            return _Search("violation", steps, best[0], best[1])
        else:
            top, state = stack.pop()
            linearized &= ~(1 << top.op)
            _unlift(top)
            entry = top.next
    return _Search("linearizable", steps)


def cut(ops: Sequence[Operation], at_ns: int) -> list[Operation]:
    """The history as it stood at ``at_ns``: operations invoked by then, those that had not
    returned by then as unknown."""
    return [
        op if op.return_ns is not None and op.return_ns <= at_ns
        else dataclasses.replace(op, return_ns=None)
        for op in ops
        if op.invoke_ns <= at_ns
    ]  # fmt: skip


def check(
    ops: Sequence[Operation],
    model: Model[S],
    *,
    budget: int = DEFAULT_BUDGET,
    render: Callable[[Any, Any], str] | None = None,
) -> Verdict:
    """Whether ``ops`` (one object's history) is linearizable for ``model``; ``render(call,
    outcome)`` writes one operation in an example (``repr`` of both by default)."""
    found = _search(ops, model, budget)
    if found.status == "unknown":
        return Verdict("unknown", found.steps, (f"search budget of {budget} steps exceeded",))
    if found.status == "linearizable":
        return Verdict("linearizable", found.steps)
    shortest, witness, steps = _earliest_cut(ops, model, budget)
    if witness.status != "violation":  # the cut's own search ran out of budget: show it all
        shortest, witness = list(ops), found
    # the operations the cut made unknown, though their client learned the outcome later
    cut_short = {i for i, op in enumerate(shortest) if not op.known and _known_in(op, ops)}
    lines = _example(shortest, witness, model, render or _default_render, cut_short)
    return Verdict("violation", found.steps + steps, tuple(lines))


def _known_in(op: Operation, ops: Sequence[Operation]) -> bool:
    """Whether the unknown ``op`` of a cut is known in the whole history ``ops``."""
    return any(o.known and o.invoke_ns == op.invoke_ns and o.call == op.call
               and o.client == op.client for o in ops)  # fmt: skip


def _earliest_cut(
    ops: Sequence[Operation], model: Model[S], budget: int
) -> tuple[list[Operation], _Search[S], int]:
    """Binary search over the return times for the earliest cut that is not linearizable
    (cuts only grow more constrained with time, so the predicate is monotone)."""
    times = sorted({op.return_ns for op in ops if op.return_ns is not None})
    steps = 0

    def fails(i: int) -> bool:
        nonlocal steps
        found = _search(cut(ops, times[i]), model, budget)
        steps += found.steps
        return found.status == "violation"

    # A violation has at least one return; if no cut fails within the budget, the last one
    # (the whole history but unknown operations invoked after every return) is shown.
    lo = bisect.bisect_left(range(len(times)), True, key=fails)
    shortest = cut(ops, times[min(lo, len(times) - 1)])
    witness = _search(shortest, model, budget)
    return shortest, witness, steps + witness.steps


def _default_render(call: Any, outcome: Any) -> str:
    return f"{call!r} -> {outcome!r}"


def _example(
    ops: Sequence[Operation],
    found: _Search[Any],
    model: Model[Any],
    render: Callable[[Any, Any], str],
    cut_short: set[int],
) -> list[str]:
    start = min(op.invoke_ns for op in ops)

    def line(i: int) -> str:
        text = _line(ops[i], start, render)
        return f"{text} (returned {ops[i].outcome!r} after the cut)" if i in cut_short else text

    order = sorted(range(len(ops)), key=lambda i: ops[i].invoke_ns)
    shown = order[-EXAMPLE_LINES:]
    lines = [f"the first {len(ops)} operations (by invoke) already cannot be linearized:"]
    if len(shown) < len(order):
        lines.append(f"  ... {len(order) - len(shown)} earlier operations")
    lines += [f"  {line(i)}" for i in shown]
    lines.append(
        f"longest legal order found: {len(found.best)} of {len(ops)} operations, "
        f"ending in state {found.best_state!r}"
    )
    for i in _next_candidates(ops, set(found.best)):
        op = ops[i]
        legal = model.step(found.best_state, op.call, op.seen) is not None
        why = "legal here, but leads to a dead end" if legal else "illegal in that state"
        lines.append(f"  next could be {line(i)}: {why}")
    return lines


def _next_candidates(ops: Sequence[Operation], done: set[int]) -> list[int]:
    """The known operations not in ``done`` invoked before every other one returned: those the
    search had to place next (an unknown one never has to be placed)."""
    left = [i for i in range(len(ops)) if i not in done and ops[i].known]
    deadline = min((ops[i].return_ns or 0 for i in left), default=0)
    return [i for i in left if ops[i].invoke_ns <= deadline]


def _line(op: Operation, start: int, render: Callable[[Any, Any], str]) -> str:
    begin = (op.invoke_ns - start) / 1e6
    end = "?" if op.return_ns is None else f"{(op.return_ns - start) / 1e6:.3f}"
    outcome = op.outcome if op.known else UNKNOWN
    return f"[{op.client}] {begin:.3f}..{end} ms  {render(op.call, outcome)}"
