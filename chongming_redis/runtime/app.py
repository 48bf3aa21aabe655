"""``App``: a named set of task types, independent of any store or process.

Define tasks once in a module; every process that imports it (workers, submitters, the CLI)
gets the same types::

    app = App("thumbnails")

    @app.task()
    def resize(ctx: TaskContext, params: Resize) -> dict: ...

``Controller(store, app=app)`` runs them; ``chongming-redis worker mymodule:app`` too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from chongming_redis.validation import check_identifier


class UnknownTask(ValueError):
    """A task type that this process has not registered."""


class InvalidParams(ValueError):
    """Parameters that do not validate against the task type's model."""


@dataclass(frozen=True)
class TaskType:
    name: str
    fn: Callable[..., Any]
    params_model: type[BaseModel] | None
    isolation: str = "thread"

    def validate(self, params: Any) -> Any:
        """The parameters as they are stored (JSON types), or ``InvalidParams``."""
        if self.params_model is None:
            return params
        try:
            if isinstance(params, self.params_model):
                model = params
            else:
                model = self.params_model.model_validate(params if params is not None else {})
        except ValidationError as exc:
            raise InvalidParams(f"parameters of {self.name!r} do not validate: {exc}") from None
        return model.model_dump(mode="json")

    def load(self, stored: Any) -> Any:
        """The stored parameters as the function receives them."""
        if self.params_model is None:
            return stored
        return self.params_model.model_validate(stored if stored is not None else {})


class App:
    def __init__(self, name: str = "app") -> None:
        self.name = check_identifier(name, "app name")
        self.types: dict[str, TaskType] = {}

    def task(
        self,
        name: str | None = None,
        *,
        params: type[BaseModel] | None = None,
        isolation: str = "thread",
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(ctx, params)`` under ``name`` (default: the function's name). With a
        pydantic model (``params=`` or the annotation of the second argument), submitted
        parameters are validated and the function receives a model instance.

        ``isolation="process"`` runs each execution in a child process (CPU-heavy work; stop
        and pause then work without the task's cooperation: see ``runtime/isolation.py``)."""
        if isolation not in ("thread", "process"):
            raise ValueError(f"isolation must be 'thread' or 'process', not {isolation!r}")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            task_name = check_identifier(name or fn.__name__, "task name")
            model = params or _annotated_model(fn)
            self.types[task_name] = TaskType(task_name, fn, model, isolation)
            return fn

        return register

    def get(self, name: str) -> TaskType:
        task_type = self.types.get(name)
        if task_type is None:
            known = ", ".join(sorted(self.types)) or "none registered"
            raise UnknownTask(f"unknown task type {name!r} (known: {known})")
        return task_type


def _annotated_model(fn: Callable[..., Any]) -> type[BaseModel] | None:
    """The pydantic model of ``fn``'s second parameter, if it is annotated with one."""
    try:
        parameters = list(inspect.signature(fn, eval_str=True).parameters.values())
    except (NameError, TypeError, ValueError):
        return None
    if len(parameters) < 2:
        return None
    annotation = parameters[1].annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
