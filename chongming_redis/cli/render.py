"""How the read commands print for people: statuses as coloured words, times in local time
with their zone (and UTC where a single moment is shown), progress as a bar, a task's history
as a timeline, a failure's traceback as text. ``cli/json_output.py`` prints the same for scripts.

Every string that comes from the store (names, reasons, messages, parameters) is printed as
plain ``Text``, never as rich markup. ``rich.table`` is imported by the functions that build
tables, so a command that prints none does not load it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from chongming_redis.cli.json_output import plain
from chongming_redis.model import Progress, TaskSnapshot, TaskStatus, Transition

if TYPE_CHECKING:
    from rich.table import Table

    from chongming_redis.runtime.limit_defs import LimitRow

STATUS_STYLES = {
    TaskStatus.WAITING: "dim cyan",
    TaskStatus.PENDING: "cyan",
    TaskStatus.RUNNING: "bold blue",
    TaskStatus.PAUSED: "magenta",
    TaskStatus.SUCCEEDED: "green",
    TaskStatus.FAILED: "bold red",
    TaskStatus.STOPPED: "yellow",
    TaskStatus.LOST: "red",
}


def status_text(status: TaskStatus | None) -> Text:
    if status is None:
        return Text("")
    return Text(status.value, style=STATUS_STYLES.get(status, ""))


# -- times --------------------------------------------------------------------------------------


def zone_name() -> str:
    """The local zone's name (``CET``, ``UTC``)."""
    return datetime.now(timezone.utc).astimezone().tzname() or "local"


def _is_utc(local: datetime) -> bool:
    offset = local.utcoffset()
    return offset is not None and offset.total_seconds() == 0


def span(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``4 min 3 s``, ``2 h 5 min``, ``3 d 4 h``."""
    seconds = abs(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60),
                                      ("min", 60, "s", 1)):  # fmt: skip
        if whole >= size:
            rest = (whole % size) // sub_size
            return f"{whole // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{whole} s"


def relative(moment: datetime, now: datetime) -> str:
    """``3 s ago`` or ``in 27 s``."""
    seconds = (moment - now).total_seconds()
    return f"in {span(seconds)}" if seconds > 0 else f"{span(seconds)} ago"


def labelled_time(moment: datetime, now: datetime) -> str:
    """One moment for people, local and UTC both labelled:
    ``2026-03-01 13:00:05 CET (12:00:05 UTC, 3 s ago)``."""
    local = moment.astimezone()
    text = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or 'local'}"
    utc = moment.astimezone(timezone.utc)
    if _is_utc(local):
        return f"{text} ({relative(moment, now)})"
    utc_text = f"{utc:%H:%M:%S}" if utc.date() == local.date() else f"{utc:%Y-%m-%d %H:%M:%S}"
    return f"{text} ({utc_text} UTC, {relative(moment, now)})"


def short_local(moment: datetime, today: datetime) -> str:
    """``13:00:05`` today, ``03-01 13:00:05`` another day (local time)."""
    local = moment.astimezone()
    if local.date() == today.astimezone().date():
        return f"{local:%H:%M:%S}"
    return f"{local:%Y-%m-%d %H:%M:%S}"


# -- progress -----------------------------------------------------------------------------------


def progress_bar(progress: Progress | None, width: int = 10) -> Text:
    """``██████░░░░ 60% 6/10``; without a total only the count (``6``)."""
    if progress is None:
        return Text("")
    current, total = progress.current, progress.total
    if not total or total <= 0:
        return Text(_number(current))
    fraction = min(1.0, max(0.0, current / total))
    filled = int(fraction * width)  # full only when done
    bar = Text("█" * filled, style="green") + Text("░" * (width - filled), style="dim")
    return bar + Text(f" {fraction:4.0%} {_number(current)}/{_number(total)}")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# -- tasks --------------------------------------------------------------------------------------


def holds(s: TaskSnapshot) -> bool:
    """Whether a lease shown for the task means anything: a finished or waiting task keeps
    the lease columns of its last attempt, which nobody holds any more."""
    return s.status in (TaskStatus.RUNNING, TaskStatus.PAUSED)


def tasks_table(found: Sequence[TaskSnapshot], *, title: str, now: datetime) -> Table:
    from rich.table import Table  # only the commands that print tables load it

    table = Table(title=title, title_justify="left")
    # The id is what a user copies into the next command: never cut, on any terminal width
    # (the other columns give way first).
    longest = max((len(t.task_id) for t in found), default=2)
    table.add_column("id", no_wrap=True, min_width=longest)
    table.add_column("name", no_wrap=True)
    table.add_column("status", no_wrap=True, min_width=9)
    table.add_column("progress", no_wrap=True)
    table.add_column("try", justify="right", no_wrap=True, min_width=3)
    table.add_column("pri", justify="right", no_wrap=True, min_width=3)
    table.add_column("bkt", justify="right", no_wrap=True, min_width=3)
    table.add_column(f"created ({zone_name()})", no_wrap=True)
    table.add_column("held by", no_wrap=True)
    for t in found:
        table.add_row(
            Text(t.task_id), Text(t.name), status_text(t.status), progress_bar(t.progress),
            str(t.attempt), str(t.priority), str(t.bucket), short_local(t.created_at, now),
            Text(t.lease_owner or "" if holds(t) else ""),
        )  # fmt: skip
    return table


def show_task(
    console: Console,
    snapshot: TaskSnapshot,
    history: Sequence[Transition],
    now: datetime,
    parents: Mapping[str, TaskStatus | None] | None = None,
) -> None:
    """The task's fields, its traceback, then its history as a timeline. ``parents``: the
    statuses of its first parents as read (``None``: not there any more), the others named."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, value in _fields(snapshot, now):
        grid.add_row(label, value)
        if label == "status" and snapshot.parents:
            grid.add_row("after", parents_text(snapshot, parents or {}))
            grid.add_row("on parent failure", _POLICY_TEXT[snapshot.on_parent_failure])
    console.print(grid)
    failure = snapshot.failure
    if failure is not None and failure.traceback:
        console.print()
        console.print(Text("traceback", style="bold"))
        console.print(Text(failure.traceback.rstrip("\n")), soft_wrap=True)
    console.print()
    console.print(timeline(history))


_POLICY_TEXT = {
    "stop": "stop  (a parent that ends other than succeeded stops this task)",
    "run": "run  (this task runs once every parent has ended, however)",
}


def parents_text(s: TaskSnapshot, statuses: Mapping[str, TaskStatus | None]) -> Text:
    """``a1 succeeded, b2 running, c3 (gone)`` for the parents read, ``and 12 more`` after."""
    text = Text()
    shown = [p for p in s.parents if p in statuses]
    for i, parent in enumerate(shown):
        status = statuses[parent]
        text += Text(", " if i else "") + Text(parent) + Text(" ")
        text += status_text(status) if status is not None else Text("(gone)", style="dim")
    rest = len(s.parents) - len(shown)
    if rest:
        text += Text(f", and {rest} more" if shown else f"{rest} task(s)")
    return text


def _policy_fields(s: TaskSnapshot, now: datetime) -> Iterable[tuple[str, Text | str]]:
    """The task's frozen policies (``chongming_redis.policy``)."""
    yield "retry", s.retry.describe() if s.retry is not None else "the worker's default"
    if s.timeout is not None:
        deadline = "" if s.deadline is None else "  (deadline " + str(s.deadline) + ")"
        yield "timeout", f"{s.timeout:g}s per attempt{deadline}"
    if s.retention is not None:
        kept = f"{s.retention:g}s after it finished"
        if s.status.is_terminal:
            kept += "  (until " + str(s.updated_at + timedelta(seconds=s.retention)) + ")"
        yield "retention", kept
    if s.unique is not None:
        yield "unique", Text(s.unique)
    if s.limits:  # its refs, frozen at submit (``chongming-redis limits`` shows their use)
        yield "limits", Text(", ".join(s.limits))


def _fields(s: TaskSnapshot, now: datetime) -> Iterable[tuple[str, Text | str]]:
    state = status_text(s.status) + Text(f"  (version {s.status_version}, attempt {s.attempt})")
    yield from (("task", Text(s.task_id)), ("name", Text(s.name)), ("status", state))
    yield "bucket", str(s.bucket) + ("" if s.key is None else f"  (key {s.key})")
    if s.priority:
        yield "priority", str(s.priority)
    if s.tags:
        yield "tags", Text(", ".join(sorted(s.tags)))
    if s.pipeline_run_id:
        yield "pipeline", Text(s.pipeline_run_id)
    yield "created", labelled_time(s.created_at, now)
    yield "updated", labelled_time(s.updated_at, now)
    if s.not_before is not None:
        yield "not before", labelled_time(s.not_before, now)
    if s.status is TaskStatus.PENDING and s.attempt > 1:
        yield "next attempt", Text(f"{s.attempt}, due ") + labelled_time(
            max(s.not_before or s.updated_at, s.updated_at), now)  # fmt: skip
    yield from _policy_fields(s, now)
    if s.progress is not None:
        bar = progress_bar(s.progress, width=20)
        note = s.progress.message
        yield "progress", bar + Text(f"  {note}" if note else "")
    if s.heartbeat_at is not None:
        yield "heartbeat", labelled_time(s.heartbeat_at, now)
    if holds(s) and (s.lease_owner is not None or s.lease_until is not None):
        until = "" if s.lease_until is None else f" until {labelled_time(s.lease_until, now)}"
        yield "held by", Text(f"{s.lease_owner or '?'}{until}")
    yield "params", Text(_json_text(s.params))
    if s.result is not None:
        yield "result", Text(_json_text(s.result))
    if s.failure is not None:
        yield "failure", Text(f"{s.failure.error_type}: {s.failure.message}", style="red")


def _json_text(value: Any) -> str:
    return json.dumps(plain(value), ensure_ascii=False, default=repr)


def timeline(history: Sequence[Transition]) -> Table:
    """``v1  2026-03-01 13:00:05.123  ·  → pending  submitted by ...``: one line per entry,
    local time (the full date when it changes), the time since the previous entry."""
    from rich.table import Table

    table = Table(title=f"history ({_entries(len(history))}, local time {zone_name()})",
                  title_justify="left", box=None, padding=(0, 1))  # fmt: skip
    for column, justify in (("v", "right"), ("at", "left"), ("after", "right"),
                            ("change", "left"), ("reason", "left")):  # fmt: skip
        table.add_column(column, justify=justify, no_wrap=column != "reason")  # type: ignore[arg-type]
    previous: datetime | None = None
    for entry in history:
        local = entry.at.astimezone()
        same_day = previous is not None and previous.astimezone().date() == local.date()
        at = f"{local:%H:%M:%S.%f}"[:-3] if same_day else f"{local:%Y-%m-%d %H:%M:%S.%f}"[:-3]
        after = "" if previous is None else f"+{span((entry.at - previous).total_seconds())}"
        change = (Text("→ ") if entry.from_status is None
                  else status_text(entry.from_status) + Text(" → "))  # fmt: skip
        table.add_row(f"v{entry.version}", at, after, change + status_text(entry.to_status),
                      Text(entry.reason or ""))  # fmt: skip
        previous = entry.at
    return table


# -- stats and reconcile ------------------------------------------------------------------------


def ranges(numbers: Iterable[int]) -> str:
    """``0-3, 7, 9-10``"""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def counts_table(counts: Mapping[TaskStatus, int]) -> Table:
    from rich.table import Table

    total = sum(counts.values())
    table = Table(title=f"{total} task(s)", title_justify="left")
    table.add_column("status")
    table.add_column("tasks", justify="right")
    table.add_column("share", no_wrap=True)
    for status in TaskStatus:
        n = int(counts.get(status, 0))
        table.add_row(status_text(status), str(n), progress_bar(Progress(n, total or 1)))
    return table


def buckets_table(per_bucket: Mapping[int, Mapping[TaskStatus, int]]) -> Table:
    from rich.table import Table

    table = Table(title="per bucket (buckets with tasks)", title_justify="left")
    table.add_column("bkt", justify="right", no_wrap=True, min_width=3)
    for status in TaskStatus:
        table.add_column(status_text(status), justify="right")
    for bucket in sorted(per_bucket):
        row = per_bucket[bucket]
        if any(row.values()):
            table.add_row(str(bucket), *(str(row.get(s, 0)) for s in TaskStatus))
    return table


def workers_table(
    workers: Mapping[str, datetime], owners: Mapping[int, str], now: datetime
) -> Table:
    from rich.table import Table

    alive = sum(1 for until in workers.values() if until > now)
    table = Table(title=f"workers ({alive} live)", title_justify="left")
    for column in ("worker", "heartbeat", "buckets"):
        table.add_column(column, no_wrap=column != "buckets")
    for worker, until in sorted(workers.items()):
        mine = [b for b, owner in owners.items() if owner == worker]
        beat = (f"valid for {span((until - now).total_seconds())}" if until > now
                else f"expired {relative(until, now)}")  # fmt: skip
        table.add_row(Text(worker), beat, f"{len(mine)}: {ranges(mine)}" if mine else "0")
    return table


def reconcile_lines(lost: Sequence[str], retried: Sequence[str], stalled: Sequence[str]) -> Text:
    if not (lost or retried or stalled):
        return Text("nothing to reconcile: no running or paused task's lease has expired")
    lines = [
        (f"marked lost (lease expired): {len(lost)}", lost),
        (f"queued a new attempt: {len(retried)}", retried),
        (f"heartbeat stalled, lease still valid (reported only): {len(stalled)}", stalled),
    ]
    text = Text()
    for head, ids in lines:
        text.append(head + ("\n" if not ids else "\n  " + "\n  ".join(ids) + "\n"))
    return Text(text.plain.rstrip("\n"))


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def limits_table(rows: Sequence[LimitRow], task_limits: Mapping[str, Sequence[str]]) -> Table:
    """``chongming-redis limits``: a row per limit, then a row per busiest key under it."""
    from rich.table import Table

    table = Table(title=f"{len(rows)} limit(s)", title_justify="left")
    for column in ("limit", "definition", "task types", "held", "waiting"):
        table.add_column(column, justify="right" if column in ("held", "waiting") else "left")
    for row in rows:
        types = ", ".join(sorted(n for n, ids in task_limits.items() if row.limit_id in ids))
        table.add_row(Text(row.limit_id), Text(row.described), Text(types or "–"),
                      str(row.held), str(row.waiting))  # fmt: skip
        for one in row.busiest:
            key = one.ref.partition("=")[2] if "=" in one.ref else "(all)"
            table.add_row(Text(f"  {key}", style="dim"), "", "", str(one.held), str(one.waiting))
        if row.refs > len(row.busiest):
            table.add_row(Text(f"  ... {row.refs - len(row.busiest)} more key(s)", style="dim"),
                          "", "", "", "")  # fmt: skip
    return table
