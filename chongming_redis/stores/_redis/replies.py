"""The reply codes of the Lua scripts and what each means on the Python side: one table.

Every script of ``lua/`` answers with a table whose first element is a code
(``lua/lib/common.lua``). An ``'OK'`` reply may carry a second code that says how the call
succeeded (``{'OK', 'APPLIED'}``: a retry whose first attempt already ran), and
``commit_tasks`` answers one code per item. ``REPLIES`` lists, for every script, each code it
may give in each of those three places, with its meaning and, for a failure, the exception it
becomes. Each script's ``--[[ header ]]`` documents the same codes; ``tests/test_lua_scripts.py``
checks that the scripts, their headers and this table agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chongming_redis.errors import (
    CommandAlreadyExists,
    CommandNotFound,
    ConcurrencyConflict,
    CorruptRecord,
    ParentNotFound,
    ScheduleConflict,
    StoreError,
    TaskAlreadyExists,
    UniqueTaken,
    WaitingMove,
)
from chongming_redis.stores._feed import ahead


@dataclass(frozen=True)
class Call:
    """What one script call was about: the names its exceptions report (``unique``: the
    unique id of the task written, which a ``UNIQUE`` refusal names)."""

    script: str
    task_id: str = ""
    unique: str = ""
    command_id: str = ""
    expected: int = 0
    namespace: str = ""
    num_buckets: int = 0
    after: int = 0
    schedule_id: str = ""
    status: str = ""


#: Builds the exception of a failure from the call and the reply's elements after the code.
Failure = Callable[[Call, Sequence[Any]], StoreError]


@dataclass(frozen=True)
class Code:
    """One reply code: what it means, the exception it becomes (``None``: the call
    succeeded), and whether what the call asked for is in the store afterwards (written by
    this call or by an earlier attempt of it)."""

    meaning: str
    error: Failure | None = None
    applied: bool = True


@dataclass(frozen=True)
class Replies:
    """The codes of one script, by where they stand in its reply."""

    codes: Mapping[str, Code]
    """The first element of every reply."""
    details: Mapping[str, Code] = field(default_factory=dict)
    """The second element of an ``'OK'`` reply, where it is a code."""
    items: Mapping[str, Code] = field(default_factory=dict)
    """``commit_tasks``: the code of each item, in ``{'OK', code1, actual1, ...}``."""


def text(value: Any, key: str | None = None) -> str:
    """A reply element as ``str``; bytes that are not UTF-8 are a corrupt record."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecord(key or "?", None, "a field name is not UTF-8") from None
    return str(value)


def _version(actual: Any) -> int | None:
    value = text(actual)
    return int(value) if value else None


# -- the exceptions ---------------------------------------------------------------------------


def _corrupt(call: Call, rest: Sequence[Any]) -> StoreError:
    key, field_name, detail = (text(x) for x in rest[:3])
    return CorruptRecord(key, field_name or None, detail)


def _badarg(call: Call, rest: Sequence[Any]) -> StoreError:
    return StoreError(f"script {call.script!r} refused its arguments: {text(rest[0])}")


def _conflict(call: Call, rest: Sequence[Any]) -> StoreError:
    return ConcurrencyConflict(call.task_id, call.expected, _version(rest[0]))


def _schedule_conflict(call: Call, rest: Sequence[Any]) -> StoreError:
    return ScheduleConflict(call.schedule_id, call.expected, _version(rest[0]))


def _task_exists(call: Call, rest: Sequence[Any]) -> StoreError:
    return TaskAlreadyExists(call.task_id)


def _unique_taken(call: Call, rest: Sequence[Any]) -> StoreError:
    return UniqueTaken(call.unique, text(rest[0]))


def _parent_missing(call: Call, rest: Sequence[Any]) -> StoreError:
    return ParentNotFound(call.task_id, text(rest[0]))


def _waiting_move(call: Call, rest: Sequence[Any]) -> StoreError:
    return WaitingMove(call.task_id, text(rest[0]), call.status)


def _command_exists(call: Call, rest: Sequence[Any]) -> StoreError:
    return CommandAlreadyExists(call.command_id)


def _command_not_found(call: Call, rest: Sequence[Any]) -> StoreError:
    return CommandNotFound(call.command_id)


def _mismatch(call: Call, rest: Sequence[Any]) -> StoreError:
    return StoreError(
        f"namespace {call.namespace!r} runs with num_buckets={text(rest[0])}, "
        f"this worker has {call.num_buckets}: every worker must use the same value"
    )


def _ahead(call: Call, rest: Sequence[Any]) -> StoreError:
    return ahead(call.after, int(text(rest[0])))


# -- the table --------------------------------------------------------------------------------

CORRUPT = Code("a stored record does not decode; nothing written", _corrupt)
BADARG = Code("the script refused its arguments (a bug of the caller); nothing written", _badarg)
RETRIED = Code("this call's token is already there: a retry of a call that ran")
UNIQUE = Code("another unfinished task holds the unique id (reply: its id)", _unique_taken)
MISSING = Code("a WAITING task's parent does not exist (reply: its id)", _parent_missing)
WAITINGMOVE = Code("a move into WAITING, or out of it to an unfinished status (reply: the"
                   " stored status)", _waiting_move)  # fmt: skip
_SHARED = {"CORRUPT": CORRUPT, "BADARG": BADARG}

REPLIES: Mapping[str, Replies] = {
    "create": Replies(
        {"OK": Code("created"), "EXISTS": Code("another task has the id", _task_exists),
         "UNIQUE": UNIQUE, "MISSING": MISSING, **_SHARED},
        details={"APPLIED": RETRIED},
    ),
    "save": Replies(
        {"OK": Code("written"),
         "CONFLICT": Code("the stored version is another (or the task is missing)", _conflict),
         "UNIQUE": UNIQUE, "WAITINGMOVE": WAITINGMOVE, **_SHARED},
        details={"APPLIED": RETRIED},
    ),
    "touch": Replies(
        {"OK": Code("written"), **_SHARED},
        details={
            "MISSING": Code("no such task; nothing written", applied=False),
            "FENCED": Code("the fence is not the stored version; nothing written", applied=False),
        },
    ),
    "append": Replies(
        {"OK": Code("appended"), **_SHARED},
        details={"EXISTS": Code("an entry for this version is there already (first wins)")},
    ),
    "submit_command": Replies(
        {"OK": Code("stored and queued"),
         "EXISTS": Code("another command has the id", _command_exists),
         **_SHARED},
        details={"APPLIED": RETRIED},
    ),
    "claim_commands": Replies({"OK": Code("the leased commands"), **_SHARED}),
    "complete_command": Replies(
        {"OK": Code("finished now"),
         "NOTFOUND": Code("no such command", _command_not_found),
         **_SHARED},
        details={"ALREADY": Code("finished before; the first outcome stays")},
    ),
    "release_command": Replies(
        {"OK": Code("back in the queue (or was not leased)"),
         "NOTFOUND": Code("no such command", _command_not_found),
         **_SHARED},
        details={"FINISHED": Code("the command is finished and stays so", applied=False)},
    ),
    "prune": Replies({"OK": Code("dropped, still to drop"), **_SHARED}),
    "expire_finished": Replies({"OK": Code("the removed ids, earliest expiry first"), **_SHARED}),
    "query": Replies({"OK": Code("one page of matches"), **_SHARED}),
    "pool_tick": Replies(
        {"OK": Code("held buckets, live workers"),
         "MISMATCH": Code("the namespace records another num_buckets", _mismatch),
         "BADARG": BADARG},
    ),
    "start_tasks": Replies({"OK": Code("the started tasks"), **_SHARED}),
    "commit_start": Replies({"OK": Code("the commit's reply, then the start's"), **_SHARED}),
    "upgrade_start_order": Replies({"OK": Code("index entries looked at"), **_SHARED}),
    "commit_tasks": Replies(
        {"OK": Code("one code per item"), **_SHARED},
        items={
            "OK": Code("written"),
            "APPLIED": RETRIED,
            "CONFLICT": Code("the stored version is another (or the task is missing)", _conflict),
            "EXISTS": Code("a create whose id is taken", _task_exists),
            "UNIQUE": UNIQUE,
            "MISSING": MISSING,
            "WAITINGMOVE": WAITINGMOVE,
        },
    ),
    "changes": Replies(
        {"OK": Code("one page of the feed"),
         "AHEAD": Code("the cursor is beyond the last position issued", _ahead),
         **_SHARED},
    ),
    "task_commands": Replies({"OK": Code("the task's newest commands, oldest first"), **_SHARED}),
    "write_schedule": Replies(
        {"OK": Code("written: the version, and whether the task was created"),
         "CONFLICT": Code("the stored version is another", _schedule_conflict),
         "UNIQUE": UNIQUE, "MISSING": MISSING, **_SHARED},
    ),
    "delete_schedule": Replies({"OK": Code("whether it existed"), **_SHARED}),
    "release_dependents": Replies({"OK": Code("children judged, parents left"), **_SHARED}),
}  # fmt: skip


def _lookup(codes: Mapping[str, Code], call: Call, code: str) -> Code:
    try:
        return codes[code]
    except KeyError:
        raise StoreError(f"script {call.script!r} replied with an unknown code {code!r}") from None


def check(call: Call, reply: list[Any]) -> list[Any]:
    """Raise the exception of a failing reply; else return it, its code made ``str``."""
    code = reply[0] = text(reply[0])
    error = _lookup(REPLIES[call.script].codes, call, code).error
    if error is not None:
        raise error(call, reply[1:])
    return reply


def applied(call: Call, reply: Sequence[Any]) -> bool:
    """Whether an ``'OK'`` reply says that what the call asked for is in the store."""
    if len(reply) < 2:
        return True
    return _lookup(REPLIES[call.script].details, call, text(reply[1])).applied


def item_error(call: Call, code: Any, actual: Any) -> StoreError | None:
    """The exception one ``commit_tasks`` item met (``None``: written, or already written)."""
    error = _lookup(REPLIES[call.script].items, call, text(code)).error
    return None if error is None else error(call, [actual])
