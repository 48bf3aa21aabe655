"""The ``linearizability`` section of a stress run's report: the operation logs of the workers
and the driver (``stress/oplog.py``) checked per task and per command, each violation also a
``not_linearizable`` violation of the run (``report.VIOLATION_KINDS``: it fails the run), and
the section's rows in the table and its words on the ``--seeds`` line. A history over the
search's budget is ``unknown``: counted and shown, never a pass, and not a violation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chongming_redis.model import TaskSnapshot, Transition
from chongming_redis.stress import oplog
from chongming_redis.stress.checkers import Violation

KIND = "not_linearizable"


def check(
    directory: Path | None,
    histories: Mapping[str, Sequence[Transition]],
    finals: Mapping[str, TaskSnapshot | None],
    store: Any,
) -> dict[str, Any] | None:
    """The section, or ``None`` when the run kept no operation log (``directory`` ``None`` or
    absent). ``histories`` and ``finals``: the submitted tasks' (the feed watch's for those
    removed); the store gives the rest (its ``history`` and ``get``: the tasks the workers
    created) and the commands' last state (``get_command``)."""
    if directory is None or not directory.is_dir():
        return None
    return oplog.check_dir(directory, histories, final_snapshots=finals,
                           read_command=getattr(store, "get_command", None),
                           read_history=store.history, read_task=store.get)  # fmt: skip


def violations(section: Mapping[str, Any] | None) -> list[Violation]:
    """Each violation of the section as the run's ``not_linearizable``, with its minimal
    example (the task's or command's operations up to the earliest moment no order explains)."""
    found = []
    for v in (section or {}).get("violations", []):
        what = "command" if "command_id" in v else "task"
        subject = v.get("command_id") or v.get("task_id") or "?"
        example = "\n    ".join(str(line) for line in v.get("example", []))
        found.append(Violation(KIND, subject, f"{v['kind']} ({what}):\n    {example}"))
    return found


def checked(section: Mapping[str, Any]) -> tuple[int, int]:
    """``(linearizable, checked)``: the histories (tasks and commands) checked, and those found
    linearizable (neither a violation nor over the budget)."""
    total = section["histories"] + section["commands"]["histories"]
    bad = {_subject(v) for v in section["violations"]} | {_subject(u) for u in section["unknown"]}
    return total - len(bad), total


def _subject(entry: Mapping[str, Any]) -> tuple[str, str]:
    if "command_id" in entry:
        return "command", entry["command_id"]
    return "task", entry["task_id"]


def rows(section: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The table's rows (its violations have their own ``violations: not_linearizable``)."""
    if section is None:
        return [("linearizability", "not recorded")]
    good, total = checked(section)
    commands = section["commands"]
    return [
        ("linearizability", f"{good}/{total} histories linearizable"),
        ("lin: tasks / commands", f"{section['histories']} / {commands['histories']}"),
        ("lin: operations", str(section["operations"] + commands["operations"])),
        ("lin: over budget (unknown)", str(len(section["unknown"]))),
        ("lin: check seconds", str(section["seconds"])),
    ]


def summary(section: Mapping[str, Any] | None) -> str:
    """The ``--seeds`` line's words: ``linearizable N/M`` (and how many were over the budget),
    or the violations' count."""
    if section is None:
        return "linearizability not recorded"
    good, total = checked(section)
    over = len(section["unknown"])
    if section["violations"]:
        return f"not linearizable: {len(section['violations'])} violation(s)"
    return f"linearizable {good}/{total}" + (f" ({over} over budget)" if over else "")
