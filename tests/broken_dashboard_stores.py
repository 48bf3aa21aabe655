"""Broken dashboard-read stores: each breaks one rule of ``PagedQueryStore`` or
``CommandInspectingStore`` (``stores/extensions.py``).

The same scheme as ``tests/broken_extension_stores.py``, which merges ``BROKEN`` and
``CAUGHT_BY`` into its own tables: every class is a small subclass of ``InMemoryTaskStore``
that keeps its signatures and its extensions, and breaks one rule; ``CAUGHT_BY`` names the
``ExtensionsContract`` test that pins it. Paging is easier to break on a rebuild: ``_Pager``
pages with ``query`` and one hook per rule, and is sound as written (``SOUND``). The worker
beats are Redis-only (the in-memory store has no pool); their broken stores are Redis stores,
in ``tests/test_extensions_teeth.py``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from chongming_redis.errors import StoreClosed
from chongming_redis.model import Command, CommandBacklog, TaskQuery, TaskSnapshot
from chongming_redis.stores import _checks as check
from chongming_redis.stores.memory import InMemoryTaskStore

Position = tuple[datetime, str]

# -- PagedQueryStore ------------------------------------------------------------------------


class _Pager(InMemoryTaskStore):
    """``query_page`` rebuilt on ``query``: the whole ordered result, then the tasks after the
    position (``later``), then the limit (``cut``)."""

    def query_page(
        self, query: TaskQuery | None = None, *, after: Position | None = None
    ) -> list[TaskSnapshot]:
        q = check.check_query(query)
        position = self.position(after)
        if position is None:
            return self.query(q)
        everything = self.query(self.source(q))
        return self.cut([s for s in everything if self.later(s, position, q)], q.limit)

    def position(self, after: object) -> Position | None:
        return check.check_after(after)

    def source(self, q: TaskQuery) -> TaskQuery:
        return replace(q, limit=None)

    def later(self, s: TaskSnapshot, position: Position, q: TaskQuery) -> bool:
        mine = (s.created_at, s.task_id)
        return mine < position if q.newest_first else mine > position

    def cut(self, found: list[TaskSnapshot], limit: int | None) -> list[TaskSnapshot]:
        return found if limit is None else found[:limit]


class QueryPageIncludesItsPosition(_Pager):
    """The task at the position starts the next page again (>= instead of >)."""

    def later(self, s: TaskSnapshot, position: Position, q: TaskQuery) -> bool:
        mine = (s.created_at, s.task_id)
        return mine <= position if q.newest_first else mine >= position


class QueryPageSkipsTheFirstAfter(_Pager):
    """The first task after the position is skipped (off by one the other way)."""

    def cut(self, found: list[TaskSnapshot], limit: int | None) -> list[TaskSnapshot]:
        return super().cut(found[1:], limit)


class QueryPageSkipsTies(_Pager):
    """Only created_at is compared: tasks sharing the position's instant are skipped."""

    def later(self, s: TaskSnapshot, position: Position, q: TaskQuery) -> bool:
        return s.created_at < position[0] if q.newest_first else s.created_at > position[0]


class QueryPageIgnoresNewestFirst(_Pager):
    """A newest-first page takes the tasks after the position in ascending order."""

    def later(self, s: TaskSnapshot, position: Position, q: TaskQuery) -> bool:
        return (s.created_at, s.task_id) > position


class QueryPageIgnoresTheLimit(_Pager):
    """Every task after the position comes in one page."""

    def cut(self, found: list[TaskSnapshot], limit: int | None) -> list[TaskSnapshot]:
        return found


class QueryPageDropsTheFilters(_Pager):
    """A page with a position forgets the query's filters (only order and limit stay)."""

    def source(self, q: TaskQuery) -> TaskQuery:
        return TaskQuery(newest_first=q.newest_first)


class QueryPageNeedsAStoredTask(_Pager):
    """A position whose task is gone (pruned) starts from the beginning again."""

    def query_page(
        self, query: TaskQuery | None = None, *, after: Position | None = None
    ) -> list[TaskSnapshot]:
        position = check.check_after(after)
        if position is not None and self.get(position[1]) is None:
            return self.query(query)
        return super().query_page(query, after=after)


class QueryPageTruncatesToMilliseconds(_Pager):
    """The position's instant loses its microseconds (a ms cursor, as a JS client would)."""

    def position(self, after: object) -> Position | None:
        found = super().position(after)
        if found is None:
            return None
        moment, task_id = found
        return moment.replace(microsecond=moment.microsecond // 1000 * 1000), task_id


class QueryPageAcceptsAList(_Pager):
    """A position given as a list is taken (a JSON round trip would make one)."""

    def position(self, after: object) -> Position | None:
        return super().position(tuple(after) if isinstance(after, list) else after)


class QueryPageChecksTheStoreFirst(_Pager):
    """A closed store says StoreClosed to a bad position: the backend came first."""

    def position(self, after: object) -> Position | None:
        with self._open():
            pass
        return super().position(after)


# -- CommandInspectingStore.task_commands ----------------------------------------------------


class TaskCommandsMatchAPrefix(InMemoryTaskStore):
    """Lists the commands of every task whose id starts with the one asked ("t1" gets t10's)."""

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        check.check_task_commands(task_id, limit)
        with self._open():
            ids = [c for t, cs in self._task_commands.items() if t.startswith(task_id) for c in cs]
        found = [c for c in (self.get_command(i) for i in ids) if c is not None]
        found.sort(key=lambda c: (c.created_at, c.command_id))
        return found[-limit:]


class TaskCommandsTakeTheOldest(InMemoryTaskStore):
    """Returns the oldest ``limit`` commands instead of the newest."""

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        return super().task_commands(task_id, limit=1000)[:limit]


class TaskCommandsNewestFirst(InMemoryTaskStore):
    """Returns the newest ``limit``, newest first."""

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        return super().task_commands(task_id, limit=limit)[::-1]


class TaskCommandsInSubmitOrder(InMemoryTaskStore):
    """Lists a task's commands in the order they were submitted, not by created_at."""

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        check.check_task_commands(task_id, limit)
        with self._open():
            ids = list(self._task_commands.get(task_id, ()))
        return [c for c in (self.get_command(i) for i in ids[-limit:]) if c is not None]


class TaskCommandsTiesInSubmitOrder(InMemoryTaskStore):
    """Orders by created_at alone: commands of one instant come in submit order, not by id."""

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        check.check_task_commands(task_id, limit)
        with self._open():
            ids = list(self._task_commands.get(task_id, ()))
        found = [c for c in (self.get_command(i) for i in ids) if c is not None]
        found.sort(key=lambda c: c.created_at)  # stable: submit order among ties
        return found[-limit:]


class TaskCommandsSurvivePrune(InMemoryTaskStore):
    """Pruning a task leaves its command list (and a new task of that id inherits it)."""

    def prune(self, *, keep_terminal: int) -> int:
        with self._open():
            lists = {t: dict(cs) for t, cs in self._task_commands.items()}
        dropped = super().prune(keep_terminal=keep_terminal)
        with self._open():
            for task_id, ids in lists.items():
                self._task_commands.setdefault(task_id, ids)
        return dropped


class TaskCommandsAsSubmitted(InMemoryTaskStore):
    """Lists each command as it was submitted: no lease, no finish, no outcome."""

    def __init__(self) -> None:
        super().__init__()
        self._submitted: dict[str, Command] = {}

    def submit_command(self, command: Command) -> None:
        super().submit_command(command)
        self._submitted[command.command_id] = command

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        found = super().task_commands(task_id, limit=limit)
        return [self._submitted.get(c.command_id, c) for c in found]


class TaskCommandsListARefusedSubmit(InMemoryTaskStore):
    """Lists the command under its task before the id is checked: a refused duplicate is
    listed under the task it named."""

    def submit_command(self, command: Command) -> None:
        if isinstance(command, Command):
            with self._open():
                self._task_commands.setdefault(command.task_id, {})[command.command_id] = None
        super().submit_command(command)


class TaskCommandsTakeAnyLimit(InMemoryTaskStore):
    """Any positive limit goes (1001, a million), and 0 is an empty list, not an error."""

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
            if limit == 0:
                check.check_task_commands(task_id, 1)
                with self._open():
                    return []
            return super().task_commands(task_id, limit=min(limit, 1000))[-limit:]
        return super().task_commands(task_id, limit=limit)


# -- CommandInspectingStore.command_backlog --------------------------------------------------


class _Backlog(InMemoryTaskStore):
    def rows(self) -> list[Command]:
        with self._open():
            ids = list(self._commands)
        return [c for c in (self.get_command(i) for i in ids) if c is not None]


class BacklogCountsFinishedCommands(_Backlog):
    """Counts every command, finished or not, by whether it holds a lease."""

    def command_backlog(self) -> CommandBacklog:
        every = self.rows()
        waiting = [c.created_at for c in every if c.lease_until is None]
        return CommandBacklog(len(waiting), len(every) - len(waiting), min(waiting, default=None))


class BacklogTakesExpiredLeasesAsUnclaimed(_Backlog):
    """A command whose lease ran out (by this process's clock) counts as unclaimed."""

    def command_backlog(self) -> CommandBacklog:
        now = datetime.now(timezone.utc)
        open_ = [c for c in self.rows() if c.finished_at is None]
        held = [c for c in open_ if c.lease_until is not None and c.lease_until > now]
        waiting = [c.created_at for c in open_ if c not in held]
        return CommandBacklog(len(waiting), len(held), min(waiting, default=None))


class BacklogOldestInSubmitOrder(_Backlog):
    """The oldest unclaimed is the first submitted one still waiting, not the first created."""

    def command_backlog(self) -> CommandBacklog:
        found = super().command_backlog()
        waiting = [c for c in self.rows() if c.finished_at is None and c.lease_until is None]
        first = waiting[0].created_at if waiting else None
        return replace(found, oldest_unclaimed_at=first)


class BacklogOldestCountsLeasedToo(_Backlog):
    """The oldest is taken over every unfinished command, leased ones included."""

    def command_backlog(self) -> CommandBacklog:
        found = super().command_backlog()
        times = [c.created_at for c in self.rows() if c.finished_at is None]
        return replace(found, oldest_unclaimed_at=min(times) if found.unclaimed else None)


class BacklogOldestInMilliseconds(_Backlog):
    """The oldest instant comes truncated to milliseconds (a score kept in ms)."""

    def command_backlog(self) -> CommandBacklog:
        found = super().command_backlog()
        oldest = found.oldest_unclaimed_at
        if oldest is None:
            return found
        return replace(found, oldest_unclaimed_at=oldest.replace(
            microsecond=oldest.microsecond // 1000 * 1000))  # fmt: skip


class BacklogWorksAfterClose(_Backlog):
    """Counts on a closed store (from what it still holds) instead of raising StoreClosed."""

    def command_backlog(self) -> CommandBacklog:
        try:
            return super().command_backlog()
        except StoreClosed:
            return CommandBacklog(0, 0, None)


class LostTheCommandBacklog(InMemoryTaskStore):
    """command_backlog was renamed away: the store silently stops being a
    CommandInspectingStore."""

    command_backlog = None  # type: ignore[assignment]


SOUND: dict[str, type[InMemoryTaskStore]] = {"_Pager": _Pager, "_Backlog": _Backlog}

WALK = "test_query_pages_concatenate_to_the_whole_query_for_every_filter_and_direction"
TIES = "test_a_page_starts_strictly_after_its_position_among_ties_and_microseconds"
PRUNED = "test_a_page_after_a_pruned_task_resumes_where_it_was"
BAD_AFTER = "test_query_page_refuses_a_bad_position_before_the_backend"
LISTS = "test_task_commands_lists_exactly_the_tasks_commands_oldest_first"
NEWEST = "test_task_commands_keeps_the_newest_limit_and_shows_leases_and_outcomes"
PRUNED_COMMANDS = "test_task_commands_of_a_pruned_task_are_gone_and_its_id_starts_afresh"
ONCE = "test_a_refused_submit_lists_nothing_and_a_command_is_listed_once"
COMMAND_ARGS = "test_task_commands_refuses_bad_arguments_before_the_backend"
BACKLOG = "test_the_command_backlog_follows_submit_claim_complete_release_and_expiry"
BACKLOG_AGE = "test_the_backlog_ages_its_oldest_by_created_at_to_the_microsecond"

#: Broken store -> the ExtensionsContract test that pins the rule it breaks.
CAUGHT_BY: dict[str, str] = {
    "QueryPageIncludesItsPosition": WALK,
    "QueryPageSkipsTheFirstAfter": WALK,
    "QueryPageSkipsTies": TIES,
    "QueryPageIgnoresNewestFirst": WALK,
    "QueryPageIgnoresTheLimit": WALK,
    "QueryPageDropsTheFilters": WALK,
    "QueryPageNeedsAStoredTask": PRUNED,
    "QueryPageTruncatesToMilliseconds": TIES,
    "QueryPageAcceptsAList": BAD_AFTER,
    "QueryPageChecksTheStoreFirst": BAD_AFTER,
    "TaskCommandsMatchAPrefix": LISTS,
    "TaskCommandsTakeTheOldest": NEWEST,
    "TaskCommandsNewestFirst": LISTS,
    "TaskCommandsInSubmitOrder": LISTS,
    "TaskCommandsTiesInSubmitOrder": LISTS,
    "TaskCommandsSurvivePrune": PRUNED_COMMANDS,
    "TaskCommandsAsSubmitted": NEWEST,
    "TaskCommandsListARefusedSubmit": ONCE,
    "TaskCommandsTakeAnyLimit": COMMAND_ARGS,
    "BacklogCountsFinishedCommands": BACKLOG,
    "BacklogTakesExpiredLeasesAsUnclaimed": BACKLOG,
    "BacklogOldestInSubmitOrder": BACKLOG,
    "BacklogOldestCountsLeasedToo": BACKLOG,
    "BacklogOldestInMilliseconds": BACKLOG_AGE,
    "BacklogWorksAfterClose": BACKLOG,
    "LostTheCommandBacklog": "test_the_store_implements_exactly_the_declared_extensions",
}

#: Every broken store of this module, by class name.
BROKEN: dict[str, type[InMemoryTaskStore]] = {
    name: cls
    for name, cls in list(globals().items())
    if isinstance(cls, type)
    and issubclass(cls, InMemoryTaskStore)
    and not name.startswith("_")
    and cls is not InMemoryTaskStore
}
