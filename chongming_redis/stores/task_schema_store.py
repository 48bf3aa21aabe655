"""``TaskSchemasStore``: the parameter schemas the namespace's workers publish (an extension,
``stores/extensions.py``), so a producer that does not import the tasks' code checks
parameters before it writes a task no worker could run.

A schema is kept per task type name, as the JSON text of a JSON Schema object (``{}``: any
JSON-able value; the store never reads inside it beyond checking it is a JSON object), with
the moment it was published. The last write of a name wins, whatever its moment: the newest
worker to start says what its type takes now. Names never written are not listed.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from chongming_redis.validation import check_dt, check_identifier

#: The largest schema text a store keeps (bytes of UTF-8): a model of some hundred fields.
MAX_SCHEMA_BYTES = 262144


@dataclass(frozen=True)
class PublishedSchema:
    """One task type's schema as published: the JSON text and when (the publisher's ``now``)."""

    schema: str
    published_at: datetime


@runtime_checkable
class TaskSchemasStore(Protocol):
    """The published schemas, one per task type name; last writer wins per name."""

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        """Publish ``schemas`` (task type name -> JSON Schema text), each replacing what its
        name had, published at ``now``; names not given keep theirs. All or nothing: a bad
        name, text (not a str, not a JSON object, over ``MAX_SCHEMA_BYTES``) or ``now`` is
        ``TypeError``/``ValueError`` before any write. An empty mapping writes nothing."""
        ...

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        """The published schemas of ``names`` (``None``: every name) as written; a name never
        published is left out (an empty ``names``: ``{}``)."""
        ...


TASK_SCHEMA_METHODS = ("record_task_schemas", "task_schemas")


def check_record(schemas: object, now: object) -> tuple[dict[str, str], datetime]:
    """``record_task_schemas``' arguments, checked whole before any write; ``now`` in UTC."""
    if not isinstance(schemas, Mapping):
        raise TypeError(f"schemas must be a mapping of name -> JSON text, not "
                        f"{type(schemas).__name__}")  # fmt: skip
    checked = {check_identifier(name, "task type name"): _check_text(name, text)
               for name, text in schemas.items()}  # fmt: skip
    return checked, check_dt(now, "now")


def check_names(names: object) -> list[str] | None:
    """``task_schemas``' ``names``: ``None`` (every name) or a collection of names, sorted."""
    if names is None:
        return None
    if isinstance(names, str | bytes) or not isinstance(names, Collection):
        raise TypeError(f"names must be a collection of str, not {type(names).__name__}")
    return sorted({check_identifier(name, "task type name") for name in names})


def _check_text(name: str, text: object) -> str:
    if type(text) is not str:
        raise TypeError(f"the schema of {name!r} must be JSON text, not {type(text).__name__}")
    try:
        if len(text.encode("utf-8")) > MAX_SCHEMA_BYTES:
            raise ValueError(f"the schema of {name!r} is longer than {MAX_SCHEMA_BYTES} bytes")
        parsed = json.loads(text)
    except UnicodeEncodeError as exc:  # a lone surrogate: no backend keeps it as text
        raise ValueError(f"the schema of {name!r} is not UTF-8 text: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the schema of {name!r} is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"the schema of {name!r} must be a JSON object, not {text[:40]!r}")
    return text
