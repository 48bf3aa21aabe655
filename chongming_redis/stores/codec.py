"""Records <-> flat rows of primitives, the one serialisation every store reuses.

A row is a one-level ``dict`` from column name to ``str``, ``int``, ``float``, ``bytes`` or
``None``: a relational row as it is, a document as a sub-object, a Redis hash as fields.

* Datetimes are integer microseconds since the Unix epoch, UTC (exact to the microsecond, and
  exact as a Lua double or sorted-set score until 2255).
* Enums are stored by ``.value``.
* Tags are a JSON array of the sorted tags (``["io","urgent"]``), so exact matching is
  possible in any backend (a quoted element never matches a substring).
* ``params`` and ``result`` are msgpack (``MAX_PAYLOAD_BYTES`` each, checked on encode); this
  module is the only place they are encoded.
* ``Progress`` and ``Failure`` are flattened into ``progress_*`` / ``failure_*`` columns.

Decoding is strict: a missing required column, a non-canonical integer, an unknown status or
undecodable bytes raise ``RowError`` naming the column; stores turn that into ``CorruptRecord``
naming the key. Decoders accept ``bytes``/``str`` where a backend hands back text (Redis does).

The scalar encodings live in ``_scalars.py`` and the strict row reader in ``_row_reader.py``;
this module exports both with the records' encoders and decoders (``__all__``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime

from chongming_redis.limits import check_refs
from chongming_redis.model import (
    Command,
    CommandKind,
    Failure,
    Progress,
    TaskSnapshot,
    Transition,
)
from chongming_redis.parents import RUN, STOP, check_parents
from chongming_redis.policy import RetryPolicy
from chongming_redis.stores._row_reader import Primitive, Reader, RowError, decode
from chongming_redis.stores._scalars import (
    MAX_PAYLOAD_BYTES,
    decode_dt,
    decode_payload,
    decode_tags,
    encode_dt,
    encode_payload,
    encode_tags,
    int_value,
    micros,
    tags_json,
)

# The scalars (``_scalars``) and ``RowError`` (``_row_reader``) are part of this module's API.
__all__ = [
    "COMMAND_COLUMNS",
    "LEASE_COLUMNS",
    "MAX_PAYLOAD_BYTES",
    "PARENT_COLUMNS",
    "SNAPSHOT_COLUMNS",
    "TRANSITION_COLUMNS",
    "Primitive",
    "Row",
    "RowError",
    "command_to_row",
    "decode_dt",
    "decode_payload",
    "decode_tags",
    "encode_dt",
    "encode_payload",
    "encode_tags",
    "int_value",
    "progress_to_columns",
    "row_to_command",
    "row_to_snapshot",
    "row_to_transition",
    "snapshot_to_row",
    "touch_columns",
    "transition_to_row",
]

Row = dict[str, Primitive]


SNAPSHOT_COLUMNS: tuple[str, ...] = (
    "task_id",
    "name",
    "status",
    "status_version",
    "created_at",
    "updated_at",
    "tags",
    "bucket",
    "key",
    "pipeline_run_id",
    "params",
    "result",
    "progress_current",
    "progress_total",
    "progress_message",
    "failure_type",
    "failure_message",
    "failure_traceback",
    "heartbeat_at",
    "lease_owner",
    "lease_until",
    "attempt",
    "not_before",
    "priority",
    "retry_policy",
    "timeout_s",
    "deadline",
    "retention_s",
    "unique_id",
    "limit_refs",
    "parents",
    "on_parent_failure",
)
LEASE_COLUMNS: tuple[str, ...] = ("lease_owner", "lease_until")
#: What a store with dependencies (``DependenciesStore``) keeps on a save: fixed at creation.
PARENT_COLUMNS: tuple[str, ...] = ("parents", "on_parent_failure")
TRANSITION_COLUMNS: tuple[str, ...] = (
    "task_id",
    "version",
    "from_status",
    "to_status",
    "at",
    "reason",
)
COMMAND_COLUMNS: tuple[str, ...] = (
    "command_id",
    "task_id",
    "kind",
    "created_at",
    "issued_by",
    "payload",
    "lease_until",
    "finished_at",
    "outcome",
)


# -- snapshots -------------------------------------------------------------------------------


def snapshot_to_row(snapshot: TaskSnapshot) -> Row:
    """Every column of ``SNAPSHOT_COLUMNS``; absent values are ``None``."""
    progress, failure = snapshot.progress, snapshot.failure
    return {
        "task_id": snapshot.task_id,
        "name": snapshot.name,
        "status": snapshot.status.value,
        "status_version": snapshot.status_version,
        "created_at": micros(snapshot.created_at),
        "updated_at": micros(snapshot.updated_at),
        "tags": tags_json(snapshot.tags),
        "bucket": snapshot.bucket,
        "key": snapshot.key,
        "pipeline_run_id": snapshot.pipeline_run_id,
        "params": encode_payload(snapshot.params, "params"),
        "result": encode_payload(snapshot.result, "result"),
        **progress_to_columns(progress),
        "failure_type": None if failure is None else failure.error_type,
        "failure_message": None if failure is None else failure.message,
        "failure_traceback": None if failure is None else failure.traceback,
        "heartbeat_at": _opt_dt(snapshot.heartbeat_at),
        "lease_owner": snapshot.lease_owner,
        "lease_until": _opt_dt(snapshot.lease_until),
        "attempt": snapshot.attempt,
        "not_before": _opt_dt(snapshot.not_before),
        "priority": snapshot.priority,
        "retry_policy": None if snapshot.retry is None else snapshot.retry.to_json(),
        "timeout_s": snapshot.timeout,
        "deadline": _opt_dt(snapshot.deadline),
        "retention_s": snapshot.retention,
        "unique_id": snapshot.unique,
        "limit_refs": json.dumps(list(snapshot.limits)) if snapshot.limits else None,
        "parents": json.dumps(list(snapshot.parents)) if snapshot.parents else None,
        # "stop" (the default) is not stored: a task's record costs no byte for it.
        "on_parent_failure": None if snapshot.on_parent_failure == "stop" else "run",
    }


def progress_to_columns(progress: Progress | None) -> Row:
    if progress is None:
        return {"progress_current": None, "progress_total": None, "progress_message": None}
    return {
        "progress_current": progress.current,
        "progress_total": progress.total,
        "progress_message": progress.message,
    }


def touch_columns(
    progress: Progress | None,
    heartbeat_at: datetime | None,
    lease_owner: str | None,
    lease_until: datetime | None,
) -> Row:
    """The columns a ``touch`` writes: only those of the arguments given (``None`` = leave
    alone); a given ``Progress`` writes all three ``progress_*`` columns."""
    columns: Row = {}
    if progress is not None:
        columns.update(progress_to_columns(progress))
    if heartbeat_at is not None:
        columns["heartbeat_at"] = encode_dt(heartbeat_at)
    if lease_owner is not None:
        columns["lease_owner"] = lease_owner
    if lease_until is not None:
        columns["lease_until"] = encode_dt(lease_until)
    return columns


def row_to_snapshot(row: Mapping[str, Primitive]) -> TaskSnapshot:
    """The inverse of ``snapshot_to_row``. Missing optional columns mean ``None``."""
    return decode(row, _snapshot_from)


def _snapshot_from(r: Reader) -> TaskSnapshot:
    current = r.number("progress_current")
    failure_type = r.text("failure_type")
    return TaskSnapshot(
        task_id=r.text_required("task_id"),
        name=r.text_required("name"),
        status=r.status("status"),
        status_version=r.int_required("status_version"),
        created_at=r.dt_required("created_at"),
        updated_at=r.dt_required("updated_at"),
        tags=r.tags("tags"),
        bucket=r.int_required("bucket"),
        key=r.text("key"),
        pipeline_run_id=r.text("pipeline_run_id"),
        params=r.payload("params"),
        result=r.payload("result"),
        progress=None
        if current is None
        else Progress(current, r.number("progress_total"), r.text("progress_message")),
        failure=None
        if failure_type is None
        else Failure(failure_type, r.text_required("failure_message"), r.text("failure_traceback")),
        heartbeat_at=r.dt("heartbeat_at"),
        lease_owner=r.text("lease_owner"),
        lease_until=r.dt("lease_until"),
        attempt=r.int_required("attempt"),
        not_before=r.dt("not_before"),
        priority=r.int_opt("priority") or 0,  # a row written before priorities: 0
        retry=_retry_policy(r.text("retry_policy")),  # a row written before policies: None
        timeout=_seconds(r.number("timeout_s")),
        deadline=r.dt("deadline"),
        retention=_seconds(r.number("retention_s")),
        unique=r.text("unique_id"),
        limits=_limit_refs(r.text("limit_refs")),  # a row written before limits: none
        parents=_parents(r.text("parents")),  # a row written before dependencies: none
        on_parent_failure=_parent_failure(r.text("on_parent_failure")),
    )


def _retry_policy(text: str | None) -> RetryPolicy | None:
    try:
        return None if text is None else RetryPolicy.from_json(text)
    except ValueError as exc:
        raise RowError("retry_policy", str(exc)) from None


def _limit_refs(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    try:
        refs = json.loads(text)
        return check_refs(refs)
    except (ValueError, TypeError) as exc:
        raise RowError("limit_refs", f"not a JSON list of limit refs: {exc}") from None


def _parents(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    try:
        return check_parents(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise RowError("parents", f"not a JSON list of task ids: {exc}") from None


def _parent_failure(text: str | None) -> str:
    if text is None:
        return STOP
    if text != RUN:
        raise RowError("on_parent_failure", f"not 'run' (or absent): {text!r}")
    return RUN


def _seconds(value: int | float | None) -> float | None:
    return None if value is None else float(value)


# -- transitions -----------------------------------------------------------------------------


def transition_to_row(transition: Transition) -> Row:
    return {
        "task_id": transition.task_id,
        "version": transition.version,
        "from_status": None if transition.from_status is None else transition.from_status.value,
        "to_status": transition.to_status.value,
        "at": micros(transition.at),
        "reason": transition.reason,
    }


def row_to_transition(row: Mapping[str, Primitive]) -> Transition:
    return decode(row, _transition_from)


def _transition_from(r: Reader) -> Transition:
    return Transition(
        task_id=r.text_required("task_id"),
        version=r.int_required("version"),
        from_status=None if r.raw("from_status") is None else r.status("from_status"),
        to_status=r.status("to_status"),
        at=r.dt_required("at"),
        reason=r.text("reason"),
    )


# -- commands --------------------------------------------------------------------------------


def command_to_row(command: Command) -> Row:
    return {
        "command_id": command.command_id,
        "task_id": command.task_id,
        "kind": command.kind.value,
        "created_at": micros(command.created_at),
        "issued_by": command.issued_by,
        "payload": encode_payload(command.payload, "payload"),
        "lease_until": _opt_dt(command.lease_until),
        "finished_at": _opt_dt(command.finished_at),
        "outcome": command.outcome,
    }


def row_to_command(row: Mapping[str, Primitive]) -> Command:
    return decode(row, _command_from)


def _command_from(r: Reader) -> Command:
    kind = r.text_required("kind")
    try:
        command_kind = CommandKind(kind)
    except ValueError:
        raise RowError("kind", f"unknown command kind {kind!r}") from None
    return Command(
        command_id=r.text_required("command_id"),
        task_id=r.text_required("task_id"),
        kind=command_kind,
        created_at=r.dt_required("created_at"),
        issued_by=r.text("issued_by"),
        payload=r.payload("payload"),
        lease_until=r.dt("lease_until"),
        finished_at=r.dt("finished_at"),
        outcome=r.text("outcome"),
    )


# -- helpers ---------------------------------------------------------------------------------


def _opt_dt(value: datetime | None) -> int | None:
    """For datetimes of a validated record (aware, UTC, in range)."""
    return None if value is None else micros(value)
