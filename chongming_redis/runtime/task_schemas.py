"""What a worker publishes of its task types' parameters when it starts (``TaskSchemasStore``):
each type's JSON Schema, from its pydantic model (``model_json_schema()``), so a producer
without the app's code checks parameters before it writes a task (``client/params_check.py``).

A type without a model, or whose model has no JSON Schema (an arbitrary type pydantic cannot
describe) or one over ``MAX_SCHEMA_BYTES``, publishes ``{}``: any JSON-able value. Best
effort, like the task type names: a store without the extension, or a failed write, only costs
producers the check.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime

from pydantic.errors import PydanticUserError

from chongming_redis.errors import StoreError
from chongming_redis.runtime.app import App, TaskType
from chongming_redis.stores.task_schema_store import MAX_SCHEMA_BYTES, TaskSchemasStore

log = logging.getLogger("chongming_redis.runtime")

#: The schema of a type that takes any JSON-able value.
ANY_VALUE = "{}"


def schema_of(task_type: TaskType) -> str:
    """The JSON text ``task_type`` publishes: its model's JSON Schema, else ``ANY_VALUE``."""
    if task_type.params_model is None:
        return ANY_VALUE
    # Here, not at the top: jsonschema (about 30 ms to import) checks models only, and a worker
    # whose types have none starts without it.
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        schema = task_type.params_model.model_json_schema()
        validator_for(schema).check_schema(schema)  # what a producer will compile
    except (PydanticUserError, SchemaError, TypeError, ValueError) as exc:
        log.info("task type %r publishes no parameter schema: %s", task_type.name, exc)
        return ANY_VALUE
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    if len(text.encode("utf-8")) > MAX_SCHEMA_BYTES:
        log.info("task type %r publishes no parameter schema: over %d bytes", task_type.name,
                 MAX_SCHEMA_BYTES)  # fmt: skip
        return ANY_VALUE
    return text


def publish_task_schemas(store: object, app: App, now: Callable[[], datetime], owner: str) -> None:
    """Publish every type's schema of ``app`` (one write); nothing on a store without
    ``TaskSchemasStore`` or an app without types."""
    if not isinstance(store, TaskSchemasStore) or not app.types:
        return
    schemas = {name: schema_of(task_type) for name, task_type in app.types.items()}
    try:
        store.record_task_schemas(schemas, now=now())
    except StoreError as exc:
        log.warning("%s: parameter schemas not published: %s", owner, exc)
