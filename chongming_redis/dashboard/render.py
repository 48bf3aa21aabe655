"""The dashboard's HTML: Jinja2 templates shipped in the package (``templates/``), escaped by
default. A page is a layout around named parts (``_counts.html``, ``_row.html`` ...); the live
updates re-render the same parts and the page swaps them in by element id, so a part looks the
same whether it came with the page or over the event stream."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import jinja2

from chongming_redis.dashboard.listing import format_mark, task_path
from chongming_redis.dashboard.pipeline import pipeline_path
from chongming_redis.model import TaskSnapshot, TaskStatus, Tombstone

STATUS_ORDER = tuple(TaskStatus)


def ago(seconds: float | None) -> str:
    """``0.4 s``, ``12 s``, ``3 min``, ``2.5 h``, ``4 d``."""
    if seconds is None:
        return "–"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172_800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86_400:.0f} d"


def when(moment: datetime | None) -> str:
    """A moment in UTC to the millisecond, its zone named: ``2026-12-01 10:31:02.123 UTC``."""
    if moment is None:
        return "–"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def value(data: Any) -> str:
    """Params and results, as readable JSON where they are JSON, else their ``repr``."""
    try:
        return json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(data)


def percent(task: TaskSnapshot) -> float | None:
    progress = task.progress
    if progress is None or not progress.total:
        return None
    return max(0.0, min(100.0, 100.0 * progress.current / progress.total))


class Renderer:
    def __init__(self, *, namespace: str, control: bool) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("chongming_redis.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(ago=ago, when=when, value=value, mark=format_mark,
                                task_url=task_path, pipeline_url=pipeline_path,
                                quote=_quote)  # fmt: skip
        self.env.globals.update(namespace=namespace, control=control, statuses=STATUS_ORDER,
                                percent=percent, is_tombstone=_is_tombstone)  # fmt: skip

    def page(self, name: str, **context: Any) -> str:
        return self.env.get_template(name).render(**context)

    def part(self, name: str, **context: Any) -> str:
        return self.env.get_template(f"_{name}.html").render(**context)

    def parts(self, names: Mapping[str, str], **context: Any) -> dict[str, str]:
        """``{element id: the part rendered}`` for ``{element id: part name}``."""
        return {element: self.part(part, **context) for element, part in names.items()}


def _quote(text: object) -> str:
    return quote(str(text), safe="")


def _is_tombstone(item: object) -> bool:
    return isinstance(item, Tombstone)
