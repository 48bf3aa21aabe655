"""Broken parameter-schema stores: each breaks one rule of ``TaskSchemasStore``
(``stores/task_schema_store.py``), in the scheme of ``tests/broken_extension_stores.py``
(``test_extensions_teeth.py`` merges ``BROKEN``, ``CAUGHT_BY`` and ``SOUND`` into its tables):
a small subclass of ``InMemoryTaskStore`` overriding ``record_task_schemas`` or
``task_schemas``; ``CAUGHT_BY`` names the ``ExtensionsContract`` test
(``testing/extensions/task_schemas.py``) that pins it."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from datetime import datetime

from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.task_schema_store import PublishedSchema, check_record

#: The extension these stores break (the reference implements it).
EXTENSION = "TaskSchemasStore"


class FirstWriterWins(InMemoryTaskStore):
    """A name keeps its first schema: a newer worker's changed schema is never seen."""

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        known = self.task_schemas()
        super().record_task_schemas({n: s for n, s in schemas.items() if n not in known}, now=now)


class LatestMomentWins(InMemoryTaskStore):
    """A write with an earlier moment than the stored one is dropped (the moment decides, not
    the order): a worker whose clock lags never replaces a schema."""

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        known = self.task_schemas()
        kept = {n: s for n, s in schemas.items() if n not in known or known[n].published_at <= now}
        super().record_task_schemas(kept, now=now)


class ReplacesEveryName(InMemoryTaskStore):
    """A publication replaces the whole set: one app's worker erases another app's schemas."""

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        check_record(schemas, now)
        if schemas:
            with self._open():
                self._task_schemas.clear()
        super().record_task_schemas(schemas, now=now)


class NormalisesTheText(InMemoryTaskStore):
    """Keeps the schema re-encoded (``json.dumps(json.loads(text))``), not as given."""

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        return {n: PublishedSchema(json.dumps(json.loads(p.schema)), p.published_at)
                for n, p in super().task_schemas(names).items()}  # fmt: skip


class KeepsWholeSeconds(InMemoryTaskStore):
    """Keeps the moment to the second (a timestamp column without its microseconds)."""

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        moment = now.replace(microsecond=0) if isinstance(now, datetime) else now
        super().record_task_schemas(schemas, now=moment)


class IgnoresTheNames(InMemoryTaskStore):
    """``task_schemas(names)`` answers every name, asked for or not."""

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        super().task_schemas(names)  # the checks
        return super().task_schemas()


class EmptyNamesMeanEvery(InMemoryTaskStore):
    """``task_schemas([])`` answers every name, as ``None`` does."""

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        return super().task_schemas(names or None)


class MatchesNamesAsPatterns(InMemoryTaskStore):
    """Names are matched as glob-like patterns (``*`` matches anything), as a backend that
    builds a pattern from them would."""

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        every = super().task_schemas()
        if names is None:
            return every
        super().task_schemas(names)  # the checks
        return {n: p for n, p in every.items() if any(w in (n, "*") for w in names)}


class PublishesAHalfRefusedCall(InMemoryTaskStore):
    """Writes each name as it checks it: a refused call leaves the names before the bad one."""

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        for name, text in schemas.items():
            super().record_task_schemas({name: text}, now=now)


class AcceptsAnyJson(InMemoryTaskStore):
    """Takes any JSON text, an array or a number too (a schema no producer can use)."""

    def record_task_schemas(self, schemas: Mapping[str, str], *, now: datetime) -> None:
        others = {n: s for n, s in schemas.items()
                  if isinstance(s, str) and _is_json(s) and not s.lstrip().startswith("{")}  # fmt: skip
        super().record_task_schemas({n: s for n, s in schemas.items() if n not in others}, now=now)
        with self._open():
            self._task_schemas.update((n, (s, encode_dt(now))) for n, s in others.items())


class ReadsAfterClose(InMemoryTaskStore):
    """Answers ``task_schemas`` after ``close()``."""

    def task_schemas(self, names: Collection[str] | None = None) -> dict[str, PublishedSchema]:
        closed, self._closed = self._closed, False
        try:
            return super().task_schemas(names)
        finally:
            self._closed = closed


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


EXACT = "test_published_schemas_are_read_back_exactly_as_written"
LAST = "test_the_last_write_of_a_name_wins_and_the_other_names_stay"
REFUSED = "test_bad_schemas_are_refused_whole_and_a_closed_store_refuses_all"
CAUGHT_BY: dict[str, str] = {
    "FirstWriterWins": LAST,
    "LatestMomentWins": LAST,
    "ReplacesEveryName": LAST,
    "NormalisesTheText": EXACT,
    "KeepsWholeSeconds": EXACT,
    "IgnoresTheNames": EXACT,
    "EmptyNamesMeanEvery": EXACT,
    "MatchesNamesAsPatterns": EXACT,
    "PublishesAHalfRefusedCall": REFUSED,
    "AcceptsAnyJson": REFUSED,
    "ReadsAfterClose": REFUSED,
}
SOUND: dict[str, type[InMemoryTaskStore]] = {}

#: Every broken store of this module, by class name.
BROKEN: dict[str, type[InMemoryTaskStore]] = {
    name: cls
    for name, cls in list(globals().items())
    if isinstance(cls, type)
    and issubclass(cls, InMemoryTaskStore)
    and not name.startswith("_")
    and cls is not InMemoryTaskStore
}
