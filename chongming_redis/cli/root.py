"""The ``chongming-redis`` command line: the root Typer app, ``--version`` and ``main``.

Every command takes ``--redis URL`` (or ``CHONGMING_REDIS_URL``), or any store's URL with
``--store URL`` (or ``CHONGMING_STORE_URL``: ``sqlite:///path``, ``postgresql://...``;
``stores/urls.py``), and ``--namespace``. A user mistake (unknown task, bad URL, the store down,
bad JSON, a bad option value) prints one line and exits 1, no traceback. The read commands
print tables for people (``cli/render.py``) and take ``--json`` for scripts
(``cli/json_output.py`` documents the keys).

The commands live one module per concern (``worker``, ``submit``, ``read``, ``control``,
``tools``, ``dashboard``); each ends in ``register(app)`` (``cli/registry.py``), called in the
order ``--help`` lists them. ``main`` imports only the module of the command it runs
(``COMMAND_MODULES``): a worker starts without the other commands' modules (nor rich, which
they print with) and without typer building their ~30 click commands: ~75 ms of a cold start.
``app``, every command, is built at its first use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from chongming_redis.cli.common import say_error

if TYPE_CHECKING:
    app: typer.Typer  # every command (``__getattr__``)

#: Each command module, in the order they are registered, with the commands it registers
#: (``tests/test_cli_lazy.py`` checks the names against the modules).
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "worker": ("worker",),
    "submit": ("submit",),
    "read": ("tasks", "show", "stats", "limits", "reconcile", "changes"),
    "control": ("stop", "pause", "resume", "retry", "result", "wait", "prune"),
    "schedules": ("schedules",),
    "tools": ("demo", "stress"),
    "dashboard": ("dashboard",),
}
_MODULE_OF = {name: module for module, names in COMMAND_MODULES.items() for name in names}


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from chongming_redis.cli.common import console

        try:
            console.print(f"chongming-redis {version('chongming-redis')}", highlight=False)
        except PackageNotFoundError:
            console.print("chongming-redis (not installed: version unknown)", highlight=False)
        raise typer.Exit(0)


EPILOG = (
    "Example: export CHONGMING_REDIS_URL=redis://127.0.0.1:6379/0; "
    "chongming-redis worker tasks:app; chongming-redis submit tasks:app resize --count 10; "
    "chongming-redis tasks --status running"
)


def root(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_version,
                     help="print the version and exit"),
    ] = False,
) -> None:  # fmt: skip
    """chongming-redis: run, submit, inspect and control tasks kept in Redis (or, with --store,
    in SQLite or PostgreSQL)."""


def build_app(modules: Iterable[str] = COMMAND_MODULES) -> typer.Typer:
    """The root app with the commands of ``modules`` (names in ``COMMAND_MODULES``)."""
    built = typer.Typer(no_args_is_help=True, add_completion=False,
                        pretty_exceptions_enable=False)  # fmt: skip
    built.callback(epilog=EPILOG)(root)
    for module in modules:
        importlib.import_module(f"chongming_redis.cli.{module}").register(built)
    return built


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()["app"] = built = build_app()
    return built


def app_for(args: list[str]) -> typer.Typer:
    """The app ``main`` runs for ``args``: the named command's module alone, or every command
    (no command, an unknown one: the help and click's suggestions list them all). The root's
    options are flags (``--version``, ``--help``): the first other argument names the
    command."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    module = _MODULE_OF.get(command or "")
    return build_app([module]) if module is not None else build_app()


#: click's exception root, as the installed typer uses it (typer >= 0.24 bundles its own click).
_CLICK_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


def main() -> None:
    """The entry point: a usage mistake (a bad option value, a missing argument) is one line
    ``error: ...`` and exit status 1, like every other user mistake."""
    try:
        code = app_for(sys.argv[1:])(standalone_mode=False)
    except typer.Abort:
        from chongming_redis.cli.common import err

        err.print("aborted", highlight=False)
        sys.exit(130)
    except _CLICK_ERROR as exc:
        usage: Any = exc
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain `chongming-redis`: the help
            from typer import rich_utils

            rich_utils.rich_format_error(usage)
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        say_error(usage.format_message() + hint)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
