"""``chongming-redis schedules``: the namespace's schedules (``client.schedules``): ``list``,
``show``, ``upsert``, ``pause``, ``resume``, ``trigger`` and ``delete``, each with ``--json``.

Tables for people, one JSON document for scripts (times as ``cli/json_output.py`` prints them:
RFC 3339 in UTC with microseconds). A schedule is printed as::

    {"id", "version", "definition": {"id", "task", "params", "cron", "every", "tz",
     "overlap"}, "paused", "next_tick", "updated_at", "last_task", "buffered",
     "counts": {"fired", "skipped", "missed", "triggered"},
     "recent": [{"outcome", "tick", "at", "task_id", "count", "last"}, ...] (newest last)}

    list --json      {"namespace", "schedules": [schedule, ...]} (by id)
    show --json      {"namespace", "schedule": schedule}
    upsert --json    {"namespace", "outcome": "created" | "updated" | "unchanged", "schedule"}
    pause/resume     {"namespace", "outcome": "paused" | "resumed" | "already paused" |
                      "not paused", "schedule"}
    trigger --json   {"namespace", "schedule_id", "task_id"}
    delete --json    {"namespace", "schedule_id", "deleted": true}

A mistake (an invalid cron expression, an unknown time zone, both or neither of ``--cron`` and
``--every``, bad ``--params`` JSON, a task name the namespace's workers do not run, an unknown
id) is one ``error:`` line and exit status 1; a refused ``upsert`` stores nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from chongming_redis.cli.common import (
    ClusterOpt,
    DurabilityOpt,
    JsonOpt,
    NamespaceOpt,
    RedisOpt,
    StoreOpt,
    UserError,
    WideOpt,
    console,
    open_store,
    out,
    print_json,
    user_errors,
    where,
)
from chongming_redis.cli.json_output import plain
from chongming_redis.cli.registry import Commands
from chongming_redis.errors import ScheduleNotFound
from chongming_redis.schedule_state import OUTCOMES, TickOutcome, definition_json
from chongming_redis.schedules import Overlap, Schedule

if TYPE_CHECKING:
    from rich.table import Table

    from chongming_redis.client.client import Client
    from chongming_redis.runtime.scheduling import StoredSchedule

group = typer.Typer(no_args_is_help=True, add_completion=False,
                    help="The namespace's schedules: list, show, upsert, pause, resume, "
                         "trigger, delete.")  # fmt: skip
commands = Commands()

IdArg = Annotated[str, typer.Argument(metavar="ID", help="the schedule's id")]


@contextmanager
def _client(redis: str | None, namespace: str, store_url: str | None, durability: int,
            cluster: bool) -> Iterator[Client]:  # fmt: skip
    """A client of the namespace's store (closed after); an unknown id is one line naming the
    namespace."""
    from chongming_redis.client.client import Client

    store = open_store(redis, namespace, store_url=store_url, durability_replicas=durability,
                       cluster=cluster)  # fmt: skip
    client = Client(store, name=f"cli-{os.uname().nodename}-{os.getpid()}", owns_store=True)
    try:
        yield client
    except ScheduleNotFound as exc:
        raise UserError(f"{exc} in namespace {namespace!r}") from None
    finally:
        client.close()


# -- JSON --------------------------------------------------------------------------------------


def _time(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def outcome_json(item: TickOutcome) -> dict[str, Any]:
    return {"outcome": item.outcome, "tick": _time(item.tick), "at": _time(item.at),
            "task_id": item.task_id, "count": item.count, "last": _time(item.last)}  # fmt: skip


def schedule_json(stored: StoredSchedule) -> dict[str, Any]:
    """One schedule as ``--json`` prints it (the module's doc)."""
    state = stored.state
    definition = definition_json(state.schedule)
    definition["params"] = plain(definition["params"])
    return {
        "id": state.schedule.id, "version": stored.version, "definition": definition,
        "paused": state.paused, "next_tick": _time(state.next_tick),
        "updated_at": _time(state.updated_at), "last_task": state.last_task,
        "buffered": _time(state.buffered),
        "counts": {outcome: int(state.counts.get(outcome, 0)) for outcome in OUTCOMES},
        "recent": [outcome_json(item) for item in state.recent],
    }  # fmt: skip


# -- text --------------------------------------------------------------------------------------


def timing(schedule: Schedule) -> str:
    """``every 60 s`` or ``cron 0 3 * * * (Europe/Berlin)``."""
    if schedule.every is not None:
        return f"every {schedule.every} s"
    return f"cron {schedule.cron} ({schedule.tz})"


def schedules_table(found: list[StoredSchedule], now: datetime) -> Table:
    from rich.table import Table

    from chongming_redis.cli.render import relative

    table = Table(title=f"{len(found)} schedule(s)", title_justify="left")
    for column in ("id", "task", "timing", "paused", "next tick", *OUTCOMES, "last task"):
        table.add_column(column, justify="right" if column in OUTCOMES else "left")
    for stored in found:
        state, schedule = stored.state, stored.schedule
        next_tick = "–" if state.paused else _utc(state.next_tick)
        if not state.paused:
            next_tick += f" ({relative(state.next_tick, now)})"
        table.add_row(Text(schedule.id), Text(schedule.task), Text(timing(schedule)),
                      "yes" if state.paused else "no", next_tick,
                      *(str(state.counts.get(o, 0)) for o in OUTCOMES),
                      Text(state.last_task or "–"))  # fmt: skip
    return table


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def show_schedule(stored: StoredSchedule, now: datetime) -> Iterator[Any]:
    """What ``show`` prints: the definition and state as fields, then the recent outcomes."""
    from rich.table import Table

    from chongming_redis.cli.render import relative

    state, schedule = stored.state, stored.schedule
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    params = json.dumps(plain(schedule.params), sort_keys=True)
    next_tick = f"{_utc(state.next_tick)} ({relative(state.next_tick, now)})"
    fields: list[tuple[str, str]] = [
        ("id", schedule.id), ("task", schedule.task), ("params", params),
        ("timing", timing(schedule)), ("overlap", schedule.overlap.value),
        ("paused", "yes (no tick fires)" if state.paused else "no"),
        ("next tick", "– (paused)" if state.paused else next_tick),
        ("last task", state.last_task or "–"),
        ("buffered", "–" if state.buffered is None else _utc(state.buffered)),
        ("counts", ", ".join(f"{o} {state.counts.get(o, 0)}" for o in OUTCOMES)),
        ("updated", _utc(state.updated_at)), ("version", str(stored.version)),
    ]  # fmt: skip
    for label, value in fields:
        grid.add_row(label, Text(value))
    yield grid
    yield ""
    if not state.recent:
        yield Text("no outcomes yet")
        return
    table = Table(title=f"recent outcomes ({len(state.recent)}, newest last)",
                  title_justify="left")  # fmt: skip
    for column in ("outcome", "tick", "decided", "task"):
        table.add_column(column)
    for item in state.recent:
        tick = _utc(item.tick)
        if item.count > 1 and item.last is not None:
            tick = f"{item.count} ticks, {tick} .. {_utc(item.last)}"
        table.add_row(item.outcome, tick, _utc(item.at), Text(item.task_id or "–"))
    yield table


# -- the commands ------------------------------------------------------------------------------


@commands.command(name="list", epilog="Example: chongming-redis schedules list --json")
def list_schedules(
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Every schedule: task, timing, paused, next tick, outcome counts, last task."""
    with user_errors(), _client(redis, namespace, store_url, durability_replicas,
                                cluster) as client:  # fmt: skip
        found = client.schedules.list()
        if as_json:
            print_json({"namespace": namespace, "schedules": [schedule_json(s) for s in found]})
        elif not found:
            console.print(f"{where(namespace, redis or store_url)} has no schedules",
                          highlight=False, soft_wrap=True)  # fmt: skip
        else:
            out(wide=wide).print(schedules_table(found, datetime.now(timezone.utc)))


@commands.command(epilog="Example: chongming-redis schedules show nightly-report --json")
def show(
    schedule_id: IdArg,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """One schedule: its definition, its state and its recent outcomes (newest last)."""
    with user_errors(), _client(redis, namespace, store_url, durability_replicas,
                                cluster) as client:  # fmt: skip
        stored = client.schedules.get(schedule_id)
        if stored is None:
            raise ScheduleNotFound(schedule_id)
        if as_json:
            print_json({"namespace": namespace, "schedule": schedule_json(stored)})
            return
        screen = out(wide=wide)
        for part in show_schedule(stored, datetime.now(timezone.utc)):
            screen.print(part, highlight=False, soft_wrap=isinstance(part, Text))


@commands.command(
    epilog="Example: chongming-redis schedules upsert nightly-report report "
    "--cron '0 3 * * *' --tz Europe/Berlin --params '{\"kind\": \"daily\"}'"
)
def upsert(
    schedule_id: IdArg,
    task: Annotated[str, typer.Argument(metavar="TASK", help="the task type each tick runs")],
    params: Annotated[str, typer.Option(help="JSON parameters of every tick's task")] = "null",
    cron: Annotated[
        str | None, typer.Option(metavar="EXPR", help="five-field cron expression, read in --tz")
    ] = None,
    every: Annotated[
        float | None,
        typer.Option(metavar="SECONDS", help="a tick every SECONDS (whole, >= 1) since the epoch"),
    ] = None,
    tz: Annotated[str, typer.Option(help="IANA time zone a cron expression is read in")] = "UTC",
    overlap: Annotated[
        Overlap, typer.Option(help="a tick while the previous tick's task is unfinished")
    ] = Overlap.SKIP,
    as_json: JsonOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Store a schedule (new, or replacing that id's definition: its outcomes and pause stay).

    Give exactly one of --cron and --every. The task name is checked against the names the
    namespace's workers recorded, the parameters against the schema they published; nothing is
    stored when anything is refused.
    """
    with user_errors():
        if (cron is None) == (every is None):
            raise UserError("give exactly one of --cron EXPR and --every SECONDS")
        try:
            decoded = json.loads(params)
        except json.JSONDecodeError as exc:
            raise UserError(f"--params is not JSON: {exc}") from None
        seconds = every if every is None or not every.is_integer() else int(every)
        schedule = Schedule(schedule_id, task, decoded, cron=cron, every=seconds, tz=tz,
                            overlap=overlap)  # fmt: skip
        with _client(redis, namespace, store_url, durability_replicas, cluster) as client:
            before = client.schedules.get(schedule.id)
            stored = client.schedules.upsert(schedule)
        if before is None:
            outcome = "created"
        else:
            outcome = "unchanged" if before.version == stored.version else "updated"
        if as_json:
            print_json({"namespace": namespace, "outcome": outcome,
                        "schedule": schedule_json(stored)})  # fmt: skip
            return
        state = stored.state
        when = "paused" if state.paused else f"next tick {_utc(state.next_tick)}"
        console.print(Text(f"schedule {schedule.id} {outcome} (version {stored.version}): "
                           f"task {schedule.task} {timing(schedule)}, {when}"),
                      highlight=False, soft_wrap=True)  # fmt: skip


def _pause_command(flag: bool) -> Any:
    action = "pause" if flag else "resume"

    def command(
        schedule_id: IdArg,
        as_json: JsonOpt = False,
        redis: RedisOpt = None,
        store_url: StoreOpt = None,
        namespace: NamespaceOpt = "default",
        durability_replicas: DurabilityOpt = 0,
        cluster: ClusterOpt = False,
    ) -> None:
        with user_errors(), _client(redis, namespace, store_url, durability_replicas,
                                    cluster) as client:  # fmt: skip
            before = client.schedules.get(schedule_id)
            if before is None:
                raise ScheduleNotFound(schedule_id)
            stored = getattr(client.schedules, action)(schedule_id)
            if before.state.paused == flag:
                outcome = "already paused" if flag else "not paused"
            else:
                outcome = "paused" if flag else "resumed"
            if as_json:
                print_json({"namespace": namespace, "outcome": outcome,
                            "schedule": schedule_json(stored)})  # fmt: skip
                return
            line = f"schedule {schedule_id}: {outcome}"
            if not stored.state.paused:
                line += f", next tick {_utc(stored.state.next_tick)}"
            console.print(Text(line), highlight=False, soft_wrap=True)

    command.__name__ = action
    command.__doc__ = (
        "Pause a schedule: no tick fires until it is resumed (the ticks meanwhile are not "
        "fired later)." if flag else "Resume a paused schedule: it fires again from the "
        "next tick after now."
    )  # fmt: skip
    return command


commands.add(_pause_command(True), name="pause",
             epilog="Example: chongming-redis schedules pause nightly-report")  # fmt: skip
commands.add(_pause_command(False), name="resume",
             epilog="Example: chongming-redis schedules resume nightly-report")  # fmt: skip


@commands.command(epilog="Example: chongming-redis schedules trigger nightly-report")
def trigger(
    schedule_id: IdArg,
    as_json: JsonOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Fire one tick now, paused or not; prints the id of the task it created."""
    with user_errors(), _client(redis, namespace, store_url, durability_replicas,
                                cluster) as client:  # fmt: skip
        handle = client.schedules.trigger(schedule_id)
        if as_json:
            print_json({"namespace": namespace, "schedule_id": schedule_id,
                        "task_id": handle.task_id})  # fmt: skip
        else:
            console.print(Text(handle.task_id), highlight=False, soft_wrap=True)


@commands.command(epilog="Example: chongming-redis schedules delete nightly-report")
def delete(
    schedule_id: IdArg,
    as_json: JsonOpt = False,
    redis: RedisOpt = None,
    store_url: StoreOpt = None,
    namespace: NamespaceOpt = "default",
    durability_replicas: DurabilityOpt = 0,
    cluster: ClusterOpt = False,
) -> None:
    """Remove a schedule (the tasks it created stay).

    A worker whose app registers it stores it again when it starts.
    """
    with user_errors(), _client(redis, namespace, store_url, durability_replicas,
                                cluster) as client:  # fmt: skip
        if not client.schedules.delete(schedule_id):
            raise ScheduleNotFound(schedule_id)
        if as_json:
            print_json({"namespace": namespace, "schedule_id": schedule_id, "deleted": True})
        else:
            console.print(Text(f"schedule {schedule_id} deleted (the tasks it created stay)"),
                          highlight=False, soft_wrap=True)  # fmt: skip


def register(app: typer.Typer) -> None:
    """``chongming-redis schedules ...``: the commands above, as one group."""
    commands.register(group)
    app.add_typer(group, name="schedules")
