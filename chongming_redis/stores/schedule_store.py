"""``SchedulesStore``: the store's schedule duties (an extension, ``stores/extensions.py``).

A schedule is one record: its id, a version and the state text (``schedule_state.to_json``;
the store keeps it as given and never reads inside it). The store's one duty beyond keeping
records is atomicity: ``write_schedule`` compares the version and sets the new state, and
when it is given a task it creates that task in the same step. That is how a tick fires
exactly once: the tick's task has a deterministic id, and of two callers that decided to fire
it from one version only one write is applied (the other gets ``ScheduleConflict`` and
nothing of it is written, task included).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores._checks import check_snapshot
from chongming_redis.validation import check_identifier, check_int

#: The largest state text a store keeps (bytes of UTF-8).
MAX_STATE_BYTES = 65536


@runtime_checkable
class SchedulesStore(Protocol):
    """Schedule records, each ``(version, state text)``; versions start at 1."""

    def write_schedule(
        self,
        schedule_id: str,
        state: str,
        *,
        expect_version: int,
        task: TaskSnapshot | None = None,
    ) -> tuple[int, bool]:
        """Set ``schedule_id``'s state if its version is ``expect_version`` (0: it must not
        exist), and create ``task`` in the same atomic step; returns ``(new version,
        whether the task was created)``. A task whose id exists already is not created again
        (``False``) and the state is still written: the tick it stands for has fired.
        ``ScheduleConflict`` when the version differs (nothing written), ``UniqueTaken`` when
        an unfinished task holds the task's unique id (nothing written), ``TypeError`` /
        ``ValueError`` for bad input (an id, a state that is not a str or too long, a
        version < 0, a task that is not a valid new ``PENDING`` task)."""
        ...

    def schedule_record(self, schedule_id: str) -> tuple[int, str] | None:
        """``(version, state)`` of ``schedule_id``, or ``None``."""
        ...

    def schedule_records(self) -> dict[str, tuple[int, str]]:
        """Every schedule: id -> ``(version, state)``."""
        ...

    def delete_schedule(self, schedule_id: str) -> bool:
        """Remove ``schedule_id``; whether it existed. The tasks its ticks created stay."""
        ...


SCHEDULE_METHODS = ("write_schedule", "schedule_record", "schedule_records", "delete_schedule")


def check_write(
    schedule_id: object, state: object, expect_version: object, task: object
) -> TaskSnapshot | None:
    """The checks every store makes before a ``write_schedule`` touches anything; the task."""
    check_identifier(schedule_id, "schedule_id")
    if type(state) is not str:
        raise TypeError(f"state must be a str, not {type(state).__name__}")
    if len(state.encode("utf-8", "surrogatepass")) > MAX_STATE_BYTES:
        raise ValueError(f"state is longer than {MAX_STATE_BYTES} bytes")
    check_int(expect_version, "expect_version", minimum=0)
    if task is None:
        return None
    checked = check_snapshot(task)
    if checked.status is not TaskStatus.PENDING or checked.status_version != 1:
        raise ValueError("a schedule's task must be a new task (PENDING, version 1)")
    return checked
