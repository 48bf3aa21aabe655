"""Argument checks every store runs before touching its backend, so that all stores refuse
the same input with the same exception and message (store guide §1)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from chongming_redis.limits import check_limit_id, check_refs, from_json, to_json
from chongming_redis.model import Command, Progress, TaskQuery, TaskSnapshot, Transition
from chongming_redis.validation import (
    check_dt,
    check_identifier,
    check_int,
    check_optional_dt,
    check_optional_identifier,
    check_optional_text,
    check_positive_seconds,
)

MAX_LEASE_SECONDS = 7 * 24 * 3600.0
MAX_CLAIM_LIMIT = 1000


def require(value: object, kind: type, what: str) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{what} must be a {kind.__name__}, not {type(value).__name__}")


def check_snapshot(snapshot: object) -> TaskSnapshot:
    require(snapshot, TaskSnapshot, "snapshot")
    return snapshot  # type: ignore[return-value]


def check_save(snapshot: object, expect_version: object) -> TaskSnapshot:
    checked = check_snapshot(snapshot)
    check_int(expect_version, "expect_version")
    if checked.status_version <= expect_version:  # type: ignore[operator]
        raise ValueError(
            f"snapshot.status_version ({checked.status_version}) must be greater than "
            f"expect_version ({expect_version}): versions never go back"
        )
    return checked


def check_query(query: object) -> TaskQuery:
    if query is None:
        return TaskQuery()
    require(query, TaskQuery, "query")
    return query  # type: ignore[return-value]


def check_transition(transition: object) -> Transition:
    require(transition, Transition, "transition")
    return transition  # type: ignore[return-value]


def check_command(command: object) -> Command:
    require(command, Command, "command")
    return command  # type: ignore[return-value]


def check_touch(
    task_id: object,
    progress: object,
    heartbeat_at: object,
    lease_owner: object,
    lease_until: object,
) -> None:
    check_identifier(task_id, "task_id")
    if progress is not None:
        require(progress, Progress, "progress")
    check_optional_dt(heartbeat_at, "heartbeat_at")
    check_optional_identifier(lease_owner, "lease_owner")
    check_optional_dt(lease_until, "lease_until")


def check_claim(now: object, lease_seconds: object, limit: object) -> datetime:
    """Returns ``now + lease_seconds`` (UTC), itself checked to be storable."""
    moment = check_dt(now, "now")
    seconds = check_positive_seconds(lease_seconds, "lease_seconds", maximum=MAX_LEASE_SECONDS)
    check_int(limit, "limit", minimum=1, maximum=MAX_CLAIM_LIMIT)
    until = check_dt(moment + timedelta(seconds=seconds), "now + lease_seconds")
    if until <= moment:  # times are microseconds: a shorter lease would end as it starts
        raise ValueError(f"lease_seconds must be at least one microsecond, not {lease_seconds!r}")
    return until


def check_keep_terminal(keep_terminal: object) -> int:
    return check_int(keep_terminal, "keep_terminal")


def check_complete(command_id: object, now: object, outcome: object) -> None:
    check_identifier(command_id, "command_id")
    check_dt(now, "now")
    check_optional_text(outcome, "outcome", max_bytes=1024)


def check_release(command_id: object, now: object) -> None:
    check_identifier(command_id, "command_id")
    check_dt(now, "now")


CommitItems = list[tuple[TaskSnapshot, int | None, list[Transition]]]
MAX_START_LIMIT = 100


def check_commit_items(items: object) -> CommitItems:
    """``commit_tasks`` items as ``(snapshot, expect_version or None, [transitions])``: a
    create when ``expect_version`` is ``None``, else a save; every transition of an item names
    its task."""
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"items must be a list, not {type(items).__name__}")
    checked: CommitItems = []
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            raise TypeError("each item must be (snapshot, expect_version or None, transitions)")
        snapshot, expect, transitions = item
        task = check_snapshot(snapshot) if expect is None else check_save(snapshot, expect)
        entries = [check_transition(t) for t in transitions]
        for entry in entries:
            if entry.task_id != task.task_id:
                raise ValueError(
                    f"a transition of task {entry.task_id!r} in the item of {task.task_id!r}"
                )
        checked.append((task, expect, entries))
    ids = [task.task_id for task, _, _ in checked]
    if len(set(ids)) != len(ids):  # each item is judged against the state before the call
        raise ValueError("items must name distinct tasks: a task may appear once per call")
    return checked


def check_start(
    owner: object, now: object, lease_until: object, buckets: object, limit: object, names: object
) -> tuple[list[int], list[str]]:
    """``start_tasks`` arguments; returns the distinct buckets and the distinct names, sorted
    (a name given twice must not make a task a candidate twice)."""
    check_identifier(owner, "owner")
    check_dt(now, "now")
    check_dt(lease_until, "lease_until")
    check_int(limit, "limit", minimum=1, maximum=MAX_START_LIMIT)
    if isinstance(buckets, (str, bytes)) or isinstance(names, (str, bytes)):
        raise TypeError("buckets and names must be sequences, not strings")
    wanted = [check_int(b, "bucket", maximum=2**31 - 1) for b in buckets]  # type: ignore[attr-defined]
    types = [check_identifier(n, "name") for n in names]  # type: ignore[attr-defined]
    return sorted(set(wanted)), sorted(set(types))


def check_task_type_names(names: Collection[str]) -> frozenset[str]:
    """``TaskTypesStore.record_task_types``' argument: a collection of task type names."""
    if isinstance(names, str | bytes) or not isinstance(names, Collection):
        raise TypeError(f"names must be a collection of str, not {type(names).__name__}")
    return frozenset(check_identifier(name, "task type name") for name in names)


MAX_TASK_COMMANDS = 1000


def check_after(after: object) -> tuple[datetime, str] | None:
    """``query_page``'s ``after``: ``None``, or ``(created_at, task_id)``, returned with the
    datetime in UTC (an aware, storable instant: what a ``created_at`` can be)."""
    if after is None:
        return None
    if not isinstance(after, tuple) or len(after) != 2:
        raise TypeError(f"after must be a (created_at, task_id) tuple, not {type(after).__name__}")
    moment, task_id = after
    return check_dt(moment, "after created_at"), check_identifier(task_id, "after task_id")


def check_task_commands(task_id: object, limit: object) -> int:
    """``task_commands``' arguments; returns ``limit`` (1..``MAX_TASK_COMMANDS``)."""
    check_identifier(task_id, "task_id")
    return check_int(limit, "limit", minimum=1, maximum=MAX_TASK_COMMANDS)


def check_expire(now: object, limit: object) -> tuple[datetime, int]:
    """``expire_finished``'s arguments: an aware ``now`` and ``1 <= limit <= 1000``."""
    return check_dt(now, "now"), check_int(limit, "limit", minimum=1, maximum=1000)


def check_record_limits(
    definitions: object, task_limits: object
) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """``record_limits``' arguments: each definition parsed and given back as canonical
    ``limits.to_json`` text (equal definitions are equal strings), each type's limit ids
    checked and all among the definitions."""
    if not isinstance(definitions, Mapping) or not isinstance(task_limits, Mapping):
        raise TypeError("definitions and task_limits must be mappings")
    checked: dict[str, str] = {}
    for limit_id, text in definitions.items():
        check_limit_id(limit_id)
        if not isinstance(text, str):
            raise TypeError(f"limit {limit_id!r}: a definition is limits.to_json text")
        checked[limit_id] = to_json(from_json(text))
    types: dict[str, tuple[str, ...]] = {}
    for name, ids in task_limits.items():
        check_identifier(name, "task type")
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise TypeError(f"task {name!r}: its limits are a sequence of limit ids")
        types[name] = tuple(check_refs(list(ids)))
        for limit_id in types[name]:
            if "=" in limit_id or limit_id not in checked:
                raise ValueError(f"task {name!r} names limit {limit_id!r}, not defined")
    return checked, types


def check_usage_limit(limit: object) -> int:
    """``limit_usage``'s ``limit``: 1..10000 refs."""
    return check_int(limit, "limit", minimum=1, maximum=10_000)
