"""From the operation logs (``stress/oplog.py``) to per-task histories, checked for
linearizability against the task model (``stress/lin_model.py``), and per-command histories of
the control commands against the command model (``stress/lin_commands.py``, which also builds
them and attributes unknown claims): the report's ``linearizability`` section.

Each recorded call becomes one operation per task it names (a batch's items are atomic per item:
one operation per item, with the call's bounds). A call without a return line (its process was
killed) or with ``unknown`` is an operation whose outcome is unknown; an unknown read is
dropped (it constrains nothing).

One ambiguity the recording cannot settle: a ``start_tasks`` / ``commit_and_start`` whose
outcome is unknown may have started *some* tasks, and nothing says which. The tasks' stored
histories do: every start writes ``started by <owner> (attempt N)`` at its version in the same
atomic step. So a start entry that no ``ok`` start explains becomes, for that task, one unknown
``Start(owner, version)`` per unknown start call of that owner (each may or may not be the one;
at most one can apply, as each needs the version before it). A start entry that no call explains
at all is itself a violation (``unexplained_start``): a write nobody made. Entries out of
``WAITING`` (the store releasing a task when its parents end) become an unknown ``Release``
that may happen at any time. A task seen absent after it existed may have been removed by a
``prune`` (which returns only a count): one unknown ``Remove`` from the first prune invoked
after the task's first operation (``attribute_removals``).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stress import linearizability as lin
from chongming_redis.stress.lin_commands import METHODS as COMMAND_METHODS
from chongming_redis.stress.lin_commands import CommandHistories, check_commands
from chongming_redis.stress.lin_model import (
    ABSENT,
    OK,
    Conflict,
    Create,
    Exists,
    Read,
    Refused,
    Register,
    Release,
    Remove,
    Save,
    Start,
    TaskModel,
    Touch,
    TouchFenced,
    render,
)

DEFAULT_BUDGET = lin.DEFAULT_BUDGET
START = re.compile(r"^started by (?P<owner>.+) \(attempt (?P<attempt>\d+)\)$")


@dataclass(frozen=True)
class Call:
    """One recorded store call. ``kind``: ``ok``, ``fail`` or ``unknown`` (also: no return)."""

    client: str
    invoke_ns: int
    return_ns: int | None
    method: str
    args: dict[str, Any]
    kind: str
    result: Any


@dataclass
class Logs:
    calls: list[Call]
    processes: int = 0
    clean_exits: int = 0
    unreadable_lines: int = 0


def read_logs(files: Iterable[Path]) -> Logs:
    """Every call of every file; a line that does not decode (cut by a kill) is counted."""
    logs = Logs([])
    for path in files:
        with open(path, encoding="utf-8") as lines:
            _read_file(lines, logs)
    return logs


def _read_file(lines: Iterable[str], logs: Logs) -> None:
    pending: dict[int, dict[str, Any]] = {}
    for line in lines:
        try:
            record = json.loads(line)
            kind = record["e"]
        except (ValueError, TypeError, KeyError):
            logs.unreadable_lines += 1
            continue
        if kind == "begin":  # a new process (a reused pid appends to the same file)
            _close_session(pending, logs)
            logs.processes += 1
        elif kind == "end":
            logs.clean_exits += 1
        elif kind == "call":
            pending[record["n"]] = record
        elif (call := pending.pop(record.get("n"), None)) is not None:
            logs.calls.append(_call(call, record["t"], kind, record.get("r")))
    _close_session(pending, logs)


def _close_session(pending: dict[int, dict[str, Any]], logs: Logs) -> None:
    logs.calls.extend(_call(call, None, "unknown", None) for call in pending.values())
    pending.clear()


def _call(record: dict[str, Any], returned: int | None, kind: str, result: Any) -> Call:
    if kind == "unknown":
        returned = None
    return Call(record["c"], record["t"], returned, record["m"], record["a"], kind, result)


@dataclass
class Histories:
    ops: dict[str, list[lin.Operation]]
    #: owner -> the start calls of that owner whose outcome is unknown
    unknown_starts: dict[str, list[Call]]
    #: invoke times of the calls that may have removed tasks no result names: ``prune``
    #: (it returns a count) and an ``expire_finished`` whose outcome is unknown
    removers: list[int] = dataclasses.field(default_factory=list)
    #: the control commands' histories, per command id (never mixed with the tasks')
    commands: CommandHistories = dataclasses.field(default_factory=CommandHistories)


def _outcome(result: Any) -> Any:
    """A recorded outcome (``None``: ok, else a refusal list) as the model's outcome."""
    if result is None:
        return OK
    if result[0] == "conflict":
        return Conflict(result[1])
    if result[0] == "exists":
        return Exists()
    return Refused(str(result[1]))


def build(calls: Iterable[Call]) -> Histories:
    found = Histories(defaultdict(list), defaultdict(list))
    for call in calls:
        _explode(call, found)
    return found


def _explode(call: Call, into: Histories) -> None:
    a, known = call.args, call.kind != "unknown"

    def add(task_id: str, op: Any, outcome: Any = None) -> None:
        ret = call.return_ns if known else None
        into.ops[task_id].append(lin.Operation(call.client, call.invoke_ns, ret, op, outcome))

    m = call.method
    if m in COMMAND_METHODS:
        into.commands.add(call)
    elif m == "create" or m == "save":
        op = Create(a["v"], a["s"], a["o"]) if m == "create" else Save(a["x"], a["v"], a["s"])
        add(a["t"], op, _outcome(call.result if call.kind == "fail" else None))
    elif m == "write_schedule":  # a tick: created, or not as its id exists (``False``)
        outcome = Exists() if call.kind == "ok" and not call.result else None
        add(a["t"], Create(a["v"], a["s"], a["o"]),
            outcome or _outcome(call.result if call.kind == "fail" else None))  # fmt: skip
    elif m == "get" and call.kind == "ok":
        add(a["t"], Read(), ABSENT if call.result is None else Register(*call.result))
    elif m in ("commit_tasks", "commit_and_start"):
        # An unknown or refused call's result is the error's name or the refusal, not results.
        returned = call.result if call.kind == "ok" else None
        results = returned if m == "commit_tasks" else (returned or {}).get("c")
        _items(call, a["i"], results, add)
        if m == "commit_and_start":
            _starts(call, a["o"], (returned or {}).get("s"), into, add)
    elif m == "start_tasks":
        _starts(call, a["o"], call.result, into, add)
    elif m == "touch" and call.kind != "fail":
        add(a["t"], Touch(a["o"]), OK)
    elif m == "touch_fenced" and call.kind != "fail":
        add(a["t"], TouchFenced(a["x"], a["o"]), call.result)
    elif m == "expire_finished" and call.kind == "ok":
        for task_id in call.result:
            add(task_id, Remove(), OK)
    elif m == "prune" or m == "expire_finished":
        into.removers.append(call.invoke_ns)


def _items(call: Call, items: Sequence[Any], results: Sequence[Any] | None, add: Any) -> None:
    if call.kind == "fail":
        return  # the whole call refused (a bad item): nothing written
    for i, (task_id, expect, version, status, owner) in enumerate(items):
        op = Create(version, status, owner) if expect is None else Save(expect, version, status)
        add(task_id, op, None if results is None else _outcome(results[i]))


def _starts(call: Call, owner: str, started: Any, into: Histories, add: Any) -> None:
    if call.kind == "unknown":
        into.unknown_starts[owner].append(call)
    elif call.kind == "ok":
        for task_id, version in started:
            add(task_id, Start(owner, version), OK)


def attribute(
    found: Histories, final_histories: Mapping[str, Sequence[Transition]]
) -> list[dict[str, Any]]:
    """Add the writes the stored histories show that no ok operation explains (see the module
    docstring); returns the ``unexplained_start`` violations."""
    first = min((op.invoke_ns for ops in found.ops.values() for op in ops), default=0)
    violations = []
    for task_id, entries in final_histories.items():
        ops = found.ops.get(task_id)
        if ops is None:
            continue  # a task no recorded client touched is out of the check
        explained = {(op.call.owner, op.call.version) for op in ops
                     if isinstance(op.call, Start) and op.known}  # fmt: skip
        # A store without batched starts is started by a save to RUNNING (then the lease and
        # the entry: ``StoreAdapter.start``): that save, ok or unknown, is the entry's write.
        running = TaskStatus.RUNNING.value
        saved = {op.call.version for op in ops
                 if isinstance(op.call, Save) and op.call.status == running}  # fmt: skip
        for entry in entries:
            if entry.from_status is TaskStatus.WAITING:
                release = Release(entry.version, entry.to_status.value)
                ops.append(lin.Operation("store", first, None, release))
                continue
            match = START.match(entry.reason or "")
            if match is None or (match["owner"], entry.version) in explained \
                    or entry.version in saved:  # fmt: skip
                continue
            start = Start(match["owner"], entry.version)
            candidates = found.unknown_starts.get(match["owner"], [])
            ops.extend(lin.Operation(c.client, c.invoke_ns, None, start) for c in candidates)
            if not candidates:
                violations.append({"task_id": task_id, "kind": "unexplained_start", "example": [
                    f"stored history: v{entry.version} {entry.reason!r}, but no recorded call of"
                    f" {match['owner']} started it (no ok start, no unknown one)"]})  # fmt: skip
    return violations


def attribute_removals(found: Histories) -> None:
    """A task seen absent (a read, a conflict with no such task, the final read) may have been
    removed by a ``prune`` (or an unknown ``expire_finished``): one unknown ``Remove`` from the
    first such call invoked after the task's first operation. One is enough: a removal applies
    once (to a final task) and an unknown operation may take effect at any time after its
    invoke, which covers every later candidate."""
    removers = sorted(found.removers)
    for ops in found.ops.values():
        if not any(op.known and (op.outcome == ABSENT or op.outcome == Conflict(None))
                   for op in ops):  # fmt: skip
            continue
        first = min(op.invoke_ns for op in ops)
        at = bisect.bisect_left(removers, first)
        if at < len(removers):
            ops.append(lin.Operation("prune", removers[at], None, Remove()))


def add_final_reads(found: Histories, finals: Mapping[str, TaskSnapshot | None]) -> None:
    """A read of each task after every recorded operation: what the store holds at the end."""
    last = max((op.return_ns or op.invoke_ns for ops in found.ops.values() for op in ops),
               default=0)  # fmt: skip
    for task_id, snapshot in finals.items():
        if task_id in found.ops:
            seen = ABSENT if snapshot is None else Register(
                snapshot.status_version, snapshot.status.value, snapshot.lease_owner)  # fmt: skip
            found.ops[task_id].append(lin.Operation("final", last + 1, last + 2, Read(), seen))


def check_records(
    logs: Logs,
    final_histories: Mapping[str, Sequence[Transition]] | None = None,
    final_snapshots: Mapping[str, TaskSnapshot | None] | None = None,
    *,
    read_command: Callable[[str], Any] | None = None,
    read_history: Callable[[str], Sequence[Transition]] | None = None,
    read_task: Callable[[str], TaskSnapshot | None] | None = None,
    budget: int = DEFAULT_BUDGET,
) -> dict[str, Any]:
    """The report's ``linearizability`` section (keys: see ``oplog.check_dir``).
    ``read_history`` and ``read_task`` (the store's ``history`` and ``get``) fill in the final
    history and snapshot of each recorded task the mappings do not name (a task a worker
    created: a schedule's tick)."""
    began = time.perf_counter()
    found = build(logs.calls)
    histories, snapshots = dict(final_histories or {}), dict(final_snapshots or {})
    for task_id in found.ops:
        if read_history is not None and task_id not in histories:
            histories[task_id] = read_history(task_id)
        if read_task is not None and task_id not in snapshots:
            snapshots[task_id] = read_task(task_id)
    violations = attribute(found, histories)
    if snapshots:
        add_final_reads(found, snapshots)
    attribute_removals(found)
    model, unknown, steps = TaskModel(), [], 0
    for task_id in sorted(found.ops):
        verdict = lin.check(found.ops[task_id], model, budget=budget, render=render)
        steps += verdict.steps
        if verdict.status == "violation":
            violations.append({"task_id": task_id, "kind": "not_linearizable",
                               "example": list(verdict.example)})  # fmt: skip
        elif verdict.status == "unknown":
            unknown.append({"task_id": task_id, "reason": "unknown (budget)",
                            "operations": len(found.ops[task_id])})  # fmt: skip
    commands = check_commands(found.commands, read_command, budget=budget)
    return {
        "histories": len(found.ops),
        "operations": sum(len(ops) for ops in found.ops.values()),
        "commands": {"histories": commands.histories, "operations": commands.operations},
        "violations": violations + commands.violations,
        "unknown": unknown + commands.unknown,
        "processes": logs.processes,
        "unclean_exits": logs.processes - logs.clean_exits,
        "unreadable_lines": logs.unreadable_lines,
        "prunes": len(found.removers),
        "steps": steps + commands.steps,
        "seconds": round(time.perf_counter() - began, 3),
    }
