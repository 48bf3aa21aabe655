"""The Redis store's schedule operations (``SchedulesStore``), plans of ``_redis.ops``'s kind.

Every schedule lives in one hash, ``{ns}:schedules``: ``v:<id>`` its version, ``s:<id>`` its
state and ``w:<id>`` the token of its last write, so a read of one (``HMGET``) or of all
(``HGETALL``) sees a version with its own state, and ``lua/write_schedule.lua`` compares, sets
and creates the tick's task in one step. A deleted schedule keeps its version (no ``s:``):
a writer that read it before the delete is refused, also once the id is made again.
Retries: a write (or delete) sent again after its reply was lost finds its own token and
answers what it did, writing nothing.
"""

from __future__ import annotations

from chongming_redis.errors import CorruptRecord
from chongming_redis.model import TaskSnapshot
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores._redis.ops import Plan, Read, script
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores._redis.rows import task_args, write_token
from chongming_redis.stores.codec import snapshot_to_row
from chongming_redis.stores.schedule_store import check_write
from chongming_redis.validation import check_identifier


def write_schedule(
    keys: Keys, schedule_id: str, state: str, expect_version: int, task: TaskSnapshot | None
) -> Plan[tuple[int, bool]]:
    checked = check_write(schedule_id, state, expect_version, task)
    args: list[object] = [schedule_id, state, expect_version, write_token()]
    task_key = keys.schedules
    if checked is None:
        args.append("0")
    else:
        task_key = keys.task(checked.task_id)
        args += ["1", *task_args(snapshot_to_row(checked), "", with_lease=True)]
    reply = yield script("write_schedule", [keys.schedules, task_key, keys.root], args,
                         schedule_id=schedule_id, expected=expect_version,
                         unique=(checked.unique if checked else None) or "")  # fmt: skip
    return int(text(reply[1])), text(reply[2]) == "1"


def schedule_record(keys: Keys, schedule_id: str) -> Plan[tuple[int, str] | None]:
    check_identifier(schedule_id, "schedule_id")
    fields = (keys.schedules, "v:" + schedule_id, "s:" + schedule_id)
    version, state = yield Read(keys.schedules, "hmget", fields)
    if state is None:  # never made, or deleted (its version stays)
        return None
    return _record(keys, schedule_id, version, state)


def schedule_records(keys: Keys) -> Plan[dict[str, tuple[int, str]]]:
    fields = yield Read(keys.schedules, "hgetall", (keys.schedules,))
    found: dict[str, tuple[int, str]] = {}
    for field, value in fields.items():
        name = text(field)
        if name.startswith("s:"):
            schedule_id = name[2:]
            version = fields.get(b"v:" + schedule_id.encode())
            found[schedule_id] = _record(keys, schedule_id, version, value)
    return found


def delete_schedule(keys: Keys, schedule_id: str) -> Plan[bool]:
    check_identifier(schedule_id, "schedule_id")
    reply = yield script("delete_schedule", [keys.schedules], [schedule_id, write_token()],
                         schedule_id=schedule_id)  # fmt: skip
    return text(reply[1]) == "1"


def _record(keys: Keys, schedule_id: str, version: bytes | None, state: bytes) -> tuple[int, str]:
    try:
        if version is None:
            raise ValueError("a state without a version")
        return int(version), state.decode("utf-8", "surrogatepass")
    except ValueError as exc:
        raise CorruptRecord(keys.schedules, "v:" + schedule_id, str(exc)) from None
