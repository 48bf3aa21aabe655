"""A producer without the app checks a task's parameters against the JSON Schema its workers
published (``TaskSchemasStore``; ``runtime/task_schemas.py`` publishes it), before anything is
written, and raises ``InvalidParams`` naming the field and the reason.

What is checked is what a worker will receive: the parameters as the store keeps them
(msgpack: a tuple arrives as a list), ``None`` as ``{}`` (a model validates ``None`` as
``{}``), ``bytes`` as text. What pydantic's lax mode takes that plain JSON Schema would refuse
is taken too: ``True`` for a number, repeated items of a ``set`` field. Otherwise it is as
strict as JSON: ``"5"`` for an integer field is refused here though pydantic's lax mode would
accept it with ``app=``; a
model's own validators (``field_validator``) are not in it, nor are formats checked
(``date-time``, ``email``): those still run on the worker.

A type with no published schema (no worker of it has started since the store had the
extension) or a schema of ``{}`` (a type without a model) accepts any value the store can keep.

Each client keeps what it read per task type for ``SCHEMA_TTL`` seconds: one read per type and
client every few seconds instead of one per submit, and a newer worker's changed schema is
enforced by every running producer within that time, the limits' rule (``RECORDED_TTL``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jsonschema.validators
from jsonschema import Draft202012Validator, SchemaError, ValidationError
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from chongming_redis.errors import CorruptRecord, InvalidParams
from chongming_redis.stores.codec import decode_payload, encode_payload
from chongming_redis.stores.task_schema_store import PublishedSchema

#: How long a client trusts the schema it read for a task type (seconds).
SCHEMA_TTL = 5.0


class SchemaCache:
    """Per task type name: the published schema (``None``: none published) and when it was
    read; read again once older than ``SCHEMA_TTL``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[float, PublishedSchema | None]] = {}

    def fresh(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and self._clock() - entry[0] < SCHEMA_TTL

    def update(self, name: str, published: PublishedSchema | None) -> None:
        self._entries[name] = (self._clock(), published)

    def get(self, name: str) -> PublishedSchema | None:
        entry = self._entries.get(name)
        return None if entry is None else entry[1]


def check_sets(name: str, sets: list[Any], published: PublishedSchema | None) -> None:
    """``check_params`` of each parameter set, the first refused one named when there are
    several (``submit_many``: "parameter set 2 of 4: ...")."""
    for index, params in enumerate(sets):
        try:
            check_params(name, params, published)
        except InvalidParams as exc:
            if len(sets) == 1:
                raise
            raise InvalidParams(f"parameter set {index} of {len(sets)}: {exc}", task=exc.task,
                                field=exc.field, reason=exc.reason) from None  # fmt: skip


def check_params(name: str, params: Any, published: PublishedSchema | None) -> None:
    """``InvalidParams`` unless ``params`` validate against ``published`` (``None``: any
    value); ``TypeError``/``ValueError`` for a value no store keeps, as a submit would."""
    if published is None:
        return
    validator = _validator(name, published.schema)
    stored = encode_payload(params, "params")  # refused here as a submit would refuse it
    instance = {} if stored is None else _as_json(decode_payload(stored))
    errors = list(validator.iter_errors(instance))
    if not errors:
        return
    error = best_match(errors)
    field, reason = _field(error), error.message
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    raise InvalidParams(
        f"parameters of {name!r} do not validate against the schema its workers published: "
        f"{field or 'params'}: {reason}{more}",
        task=name, field=field, reason=reason,
    )  # fmt: skip


def _as_json(value: Any) -> Any:
    """``value`` as its JSON Schema sees it: ``bytes`` (which a model's ``bytes`` field takes,
    published as a ``"binary"`` string) as text of the same length."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, list):
        return [_as_json(item) for item in value]
    if isinstance(value, dict):
        return {_as_json(key): _as_json(item) for key, item in value.items()}
    return value


def _lax(schema: Any) -> Any:
    """``schema`` without what pydantic's lax mode does not refuse: ``uniqueItems`` (a
    ``set`` field takes ``[1, 1]`` and keeps one)."""
    if isinstance(schema, list):
        return [_lax(item) for item in schema]
    if isinstance(schema, dict):
        return {key: _lax(item) for key, item in schema.items() if key != "uniqueItems"}
    return schema


def _number_or_bool(checker: Any, instance: Any, kind: str) -> bool:
    """pydantic's lax mode takes ``True``/``False`` for an ``int`` or ``float`` field."""
    return isinstance(instance, bool) or Draft202012Validator.TYPE_CHECKER.is_type(instance, kind)


def _field(error: ValidationError) -> str | None:
    """Where the error is, dotted (``"size.width"``, ``"items.0"``; ``None``: the whole); a
    missing property is named itself, not its object."""
    path = [str(part) for part in error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [p for p in error.validator_value if p not in error.instance]
        path += [str(missing[0])] if missing else []
    return ".".join(path) or None


@lru_cache(maxsize=256)
def _validator(name: str, text: str) -> Validator:
    """The compiled validator of a schema text (compiled once per text and type)."""
    try:
        schema = json.loads(text)
        cls = validator_for(schema, default=Draft202012Validator)
        cls.check_schema(schema)
    except (ValueError, SchemaError) as exc:
        raise CorruptRecord(f"task schema {name!r}", None,
                            f"not a JSON Schema: {str(exc).splitlines()[0]}") from None  # fmt: skip
    checker = cls.TYPE_CHECKER.redefine_many({
        "integer": lambda c, v: _number_or_bool(c, v, "integer"),
        "number": lambda c, v: _number_or_bool(c, v, "number"),
    })  # fmt: skip
    lax = jsonschema.validators.extend(cls, type_checker=checker)
    return lax(_lax(schema))
