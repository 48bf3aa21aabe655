"""The control commands as a sequential model, per command, and their histories from the
operation logs: the command half of the linearizability check (``stress/lin_history.py`` does
the tasks and builds the report).

The state of one command is a :class:`CommandRegister`: absent, or present with its
``lease_until``, ``finished_at`` and ``outcome`` (what ``get_command`` shows and what the
store's writes decide on), plus the client that last claimed it (a label for the examples: the
stores do not know who holds a lease, and no store call checks it). Times are integer
microseconds of the ``now`` the *caller* passed: every store judges a lease by that argument
(the Redis scripts take ``now`` from ``ARGV``, never the server's ``TIME``; the SQL and
in-memory stores compare with the caller's ``now`` too), so a worker with a skewed wall clock is
judged by its own clock, as the store judges it. The operations, as ``stores/protocol.py`` and
the in-memory reference (``stores/memory.py``, ``stores/_memory_reads.py``) define them:

* ``Submit(lease_until, finished_at, outcome)``: ok only on an absent command (stored as given,
  a preset lease or finish included); ``exists`` only on a present one;
* ``Claim(owner, now, until)``: one command a ``claim_commands`` call returned: only on a
  present, unfinished command with no lease or one ended by this call's now
  (``lease_until <= now``); it is then leased until ``until`` (the ``lease_until`` returned);
* ``Complete(now, outcome)``: on a present command; finishes it at ``now`` with ``outcome`` if
  unfinished, else changes nothing (the first outcome stays). No holder check: the protocol lets
  anyone complete a command, leased, expired or never claimed; ``not found`` only when absent;
* ``ReleaseCommand()``: on a present command; clears the lease of an unfinished one, leaves a
  finished one as it is. No holder check either; ``not found`` only when absent;
* ``ReadCommand()`` (``get_command``): ok with exactly the stored lease, finish and outcome.

Every store is held to these rules, Redis included: its claim script once moved every lease its
now ended but did not take back to the unleased queue, where a later claim passing an *earlier*
now took it while ``lease_until > now``; this check found it, and the contract now pins the rule
(``test_an_ended_lease_a_claim_does_not_take_stays_leased_for_an_earlier_now``).

A ``claim_commands`` call whose outcome is unknown may have leased any claimable command, and no
result says which. A claim matters to the model only through what it writes, the lease: a later
claim is never made *legal* by it (the lease it sets ends after the one before), complete and
release do not look at leases, so only a read that shows its ``lease_until`` can need it. So
an unknown claim becomes an unknown ``Claim`` of exactly the commands some read (a
``get_command`` or the final read) shows leased until that call's ``now + lease_seconds`` —
bounded, and sound: dropping an unknown claim no read shows only weakens the preconditions of
the claims after it.

Scope: which commands a claim takes (its window of ``limit`` oldest, its order) is not checked
here: a command a claim did not return says nothing (the contract tests and the lease audit of
``stress/checkers.py`` do that). Who holds a lease is not checked by any store call, so it is
not checked here either: a complete or release by a non-holder is legal. ``task_commands`` and
``command_backlog`` are not recorded; nor are payloads, ``created_at`` or the command's task,
nor the async Redis store. Commands are never removed (a prune drops a task's list, the command
stays readable by id), so there is no removal. Every process that writes commands must record,
else its writes (a submit above all) look like violations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol

from chongming_redis.stores.codec import encode_dt
from chongming_redis.stress import linearizability as lin
from chongming_redis.stress.lin_model import OK, Exists, Refused
from chongming_redis.stress.linearizability import UNKNOWN

#: the recorded store methods this module reads
METHODS = frozenset(
    {"submit_command", "claim_commands", "complete_command", "release_command", "get_command"}
)


def _at(us: int | None) -> str:
    if us is None:
        return "-"
    return datetime.fromtimestamp(us / 1e6, timezone.utc).strftime("%H:%M:%S.%f")


class CommandView(NamedTuple):
    """What a read of a present command shows."""

    lease_until: int | None
    finished_at: int | None
    outcome: str | None

    def __repr__(self) -> str:
        if self.finished_at is not None:
            return f"finished at {_at(self.finished_at)} ({self.outcome!r})"
        return "queued" if self.lease_until is None else f"leased until {_at(self.lease_until)}"


class CommandRegister(NamedTuple):
    present: bool
    lease_until: int | None
    owner: str | None  # who claimed it last (a label: no store call checks it)
    finished_at: int | None
    outcome: str | None

    def view(self) -> CommandView | None:
        return CommandView(self.lease_until, self.finished_at, self.outcome) if self.present \
            else None  # fmt: skip

    def __repr__(self) -> str:
        if not self.present:
            return "absent"
        shown = repr(self.view())
        return f"{shown} by {self.owner}" if self.owner and self.finished_at is None else shown


ABSENT_COMMAND = CommandRegister(False, None, None, None, None)


@dataclass(frozen=True)
class Submit:
    lease_until: int | None
    finished_at: int | None
    outcome: str | None

    def __str__(self) -> str:
        return f"submit {CommandView(self.lease_until, self.finished_at, self.outcome)!r}"


@dataclass(frozen=True)
class Claim:
    owner: str
    now: int
    until: int

    def __str__(self) -> str:
        return f"claim by {self.owner} at {_at(self.now)} until {_at(self.until)}"


@dataclass(frozen=True)
class Complete:
    now: int
    outcome: str | None

    def __str__(self) -> str:
        return f"complete at {_at(self.now)} ({self.outcome!r})"


@dataclass(frozen=True)
class ReleaseCommand:
    def __str__(self) -> str:
        return "release"


@dataclass(frozen=True)
class ReadCommand:
    def __str__(self) -> str:
        return "get_command"


@dataclass(frozen=True)
class NotFound:
    def __repr__(self) -> str:
        return "not found"


NOT_FOUND = NotFound()


class CommandModel:
    """``linearizability.Model`` of one command's register."""

    def init(self) -> CommandRegister:
        return ABSENT_COMMAND

    def step(self, state: CommandRegister, call: Any, outcome: Any) -> CommandRegister | None:
        if isinstance(outcome, Refused):  # refused before any I/O: nothing written
            return state
        if isinstance(call, Submit):
            return _submit(state, call, outcome)
        if isinstance(call, ReadCommand):
            return state if outcome is UNKNOWN or outcome == state.view() else None
        if not state.present:  # claim, complete, release of a command not (yet) stored
            return state if outcome is UNKNOWN or outcome == NOT_FOUND else None
        if outcome == NOT_FOUND:
            return None
        if isinstance(call, Claim):
            return _claim(state, call, outcome)
        if isinstance(call, Complete):
            return state if state.finished_at is not None \
                else state._replace(finished_at=call.now, outcome=call.outcome)  # fmt: skip
        if isinstance(call, ReleaseCommand):
            return state if state.finished_at is not None \
                else state._replace(lease_until=None, owner=None)  # fmt: skip
        raise TypeError(f"not an operation of the command model: {call!r}")


def _submit(state: CommandRegister, call: Submit, outcome: Any) -> CommandRegister | None:
    stored = CommandRegister(True, call.lease_until, None, call.finished_at, call.outcome)
    if outcome is UNKNOWN:
        return state if state.present else stored
    if isinstance(outcome, Exists):
        return state if state.present else None
    return None if state.present else stored


def _claim(state: CommandRegister, call: Claim, outcome: Any) -> CommandRegister | None:
    claimable = state.finished_at is None and (
        state.lease_until is None or state.lease_until <= call.now
    )
    if claimable:
        return state._replace(lease_until=call.until, owner=call.owner)
    return state if outcome is UNKNOWN else None


def render(call: Any, outcome: Any) -> str:
    return f"{call} -> {outcome!r}"


class RecordedCall(Protocol):
    """The fields of ``lin_history.Call`` (a frozen dataclass) this module reads."""

    @property
    def client(self) -> str: ...
    @property
    def invoke_ns(self) -> int: ...
    @property
    def return_ns(self) -> int | None: ...
    @property
    def method(self) -> str: ...
    @property
    def args(self) -> dict[str, Any]: ...
    @property
    def kind(self) -> str: ...
    @property
    def result(self) -> Any: ...


@dataclass
class CommandHistories:
    ops: dict[str, list[lin.Operation]] = field(default_factory=lambda: defaultdict(list))
    #: ``now + lease_seconds`` (us) -> the claim calls with that lease whose outcome is unknown
    unknown_claims: dict[int, list[RecordedCall]] = field(default_factory=lambda: defaultdict(list))

    def add(self, call: RecordedCall) -> None:
        """One recorded call of ``METHODS``: its operations, one per command it names."""
        a, known = call.args, call.kind != "unknown"
        ret = call.return_ns if known else None
        seen = _outcome(call.result if call.kind == "fail" else None) if known else None

        def add(command_id: str, op: Any, outcome: Any = seen) -> None:
            self.ops[command_id].append(lin.Operation(call.client, call.invoke_ns, ret, op,
                                                      outcome))  # fmt: skip

        m = call.method
        if m == "submit_command":
            add(a["k"], Submit(a["l"], a["f"], a["o"]))
        elif m == "complete_command":
            add(a["k"], Complete(a["w"], a["o"]))
        elif m == "release_command":
            add(a["k"], ReleaseCommand())
        elif m == "get_command" and call.kind == "ok":
            add(a["k"], ReadCommand(), None if call.result is None else CommandView(*call.result))
        elif m == "claim_commands" and call.kind != "fail":
            if call.kind == "unknown":
                self.unknown_claims[a["u"]].append(call)
                return
            for command_id, until in call.result:
                add(command_id, Claim(call.client, a["w"], until), OK)

    def add_final_reads(self, read: Callable[[str], Any]) -> None:
        """A ``get_command`` of each command after every recorded operation (``read``: the
        store's ``get_command``)."""
        last = max((op.return_ns or op.invoke_ns for ops in self.ops.values() for op in ops),
                   default=0)  # fmt: skip
        for command_id, ops in self.ops.items():
            seen = view(read(command_id))
            ops.append(lin.Operation("final", last + 1, last + 2, ReadCommand(), seen))

    def attribute_claims(self) -> None:
        """The unknown claims a read shows (see the module docstring): one unknown ``Claim``
        per unknown claim call whose lease ends exactly where a read of the command says."""
        for ops in self.ops.values():
            shown = {
                op.outcome.lease_until
                for op in ops
                if isinstance(op.call, ReadCommand) and op.known and op.outcome is not None
            }
            for until in sorted(u for u in shown if u in self.unknown_claims):
                ops.extend(lin.Operation(c.client, c.invoke_ns, None,
                                         Claim(c.client, c.args["w"], until))
                           for c in self.unknown_claims[until])  # fmt: skip


def view(command: Any) -> CommandView | None:
    """A ``Command`` (or ``None``) as the model's read outcome."""
    if command is None:
        return None
    return CommandView(_us(command.lease_until), _us(command.finished_at), command.outcome)


def _us(moment: datetime | None) -> int | None:
    return None if moment is None else encode_dt(moment)


def _outcome(result: Any) -> Any:
    """A recorded outcome (``None``: ok, else a refusal list) as the model's outcome."""
    if result is None:
        return OK
    if result[0] == "notfound":
        return NOT_FOUND
    if result[0] == "exists":
        return Exists()
    return Refused(str(result[-1]))


@dataclass
class CommandReport:
    histories: int
    operations: int
    violations: list[dict[str, Any]]
    unknown: list[dict[str, Any]]
    steps: int


def check_commands(
    found: CommandHistories,
    read_command: Callable[[str], Any] | None = None,
    *,
    budget: int = lin.DEFAULT_BUDGET,
) -> CommandReport:
    """Check every command's history alone; ``read_command`` adds the final reads."""
    if read_command is not None:
        found.add_final_reads(read_command)
    found.attribute_claims()
    model, report = CommandModel(), CommandReport(len(found.ops), 0, [], [], 0)
    for command_id in sorted(found.ops):
        ops = found.ops[command_id]
        report.operations += len(ops)
        verdict = lin.check(ops, model, budget=budget, render=render)
        report.steps += verdict.steps
        if verdict.status == "violation":
            report.violations.append({"command_id": command_id, "kind": "not_linearizable",
                                      "example": list(verdict.example)})  # fmt: skip
        elif verdict.status == "unknown":
            report.unknown.append({"command_id": command_id, "reason": "unknown (budget)",
                                   "operations": len(ops)})  # fmt: skip
    return report
