"""How a command module hands its commands to the root app: one way for every module.

Each module under ``cli/`` builds ``commands = Commands()``, decorates its command functions
with ``@commands.command(...)`` (the options of ``typer.Typer.command``), and ends with
``register = commands.register``; ``cli/root.py`` calls each module's ``register(app)`` in the
order ``--help`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])


class Commands:
    """The commands of one module, in the order they were defined."""

    def __init__(self) -> None:
        self._commands: list[tuple[Callable[..., Any], dict[str, Any]]] = []

    def command(self, **options: Any) -> Callable[[F], F]:
        """Collect ``fn`` with its ``app.command`` options; the function itself is unchanged."""

        def collect(fn: F) -> F:
            self.add(fn, **options)
            return fn

        return collect

    def add(self, fn: Callable[..., Any], **options: Any) -> None:
        """Collect a function made at run time (``control_command("stop")``)."""
        self._commands.append((fn, options))

    def register(self, app: typer.Typer) -> None:
        """Add every collected command to ``app``."""
        for fn, options in self._commands:
            app.command(**options)(fn)
