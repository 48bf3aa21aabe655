"""Task types for the published-schema tests (``tests/test_task_schemas.py``), run by real
worker processes as ``tests.support.schema_app:app`` and, as a newer release of the same app
whose ``echo`` takes a ``name`` too, ``tests.support.schema_app:newer``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from chongming_redis import App, TaskContext

app = App("schema-test")
newer = App("schema-test")


class Size(BaseModel):
    width: int
    height: int = 1


class Echo(BaseModel):
    x: int
    size: Size | None = None


class NamedEcho(BaseModel):
    x: int
    name: str


@app.task()
def echo(ctx: TaskContext, params: Echo) -> dict[str, Any]:
    return params.model_dump()


@app.task()
def free(ctx: TaskContext, params: Any) -> Any:
    """No model: takes any JSON-able value."""
    return params


@newer.task(name="echo")
def named_echo(ctx: TaskContext, params: NamedEcho) -> dict[str, Any]:
    return params.model_dump()
