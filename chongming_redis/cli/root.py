"""The ``chongming-redis`` command line: the root Typer app, ``--version`` and ``main``.

Every command takes ``--redis URL`` (or ``CHONGMING_REDIS_URL``), or any store's URL with
``--store URL`` (or ``CHONGMING_STORE_URL``: ``sqlite:///path``, ``postgresql://...``;
``stores/urls.py``), and ``--namespace``. A user mistake (unknown task, bad URL, the store down,
bad JSON, a bad option value) prints one line and exits 1, no traceback. The read commands
print tables for people (``cli/render.py``) and take ``--json`` for scripts
(``cli/json_output.py`` documents the keys).

The commands live one module per concern (``worker``, ``submit``, ``read``, ``control``,
``tools``, ``dashboard``); each ends in ``register(app)`` (``cli/registry.py``), called below in
the order ``--help`` lists them.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from chongming_redis.cli import control, dashboard, read, schedules, submit, tools, worker
from chongming_redis.cli.common import console, err, say_error

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"chongming-redis {version('chongming-redis')}", highlight=False)
        except PackageNotFoundError:
            console.print("chongming-redis (not installed: version unknown)", highlight=False)
        raise typer.Exit(0)


@app.callback(
    epilog="Example: export CHONGMING_REDIS_URL=redis://127.0.0.1:6379/0; "
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


for _module in (worker, submit, read, control, schedules, tools, dashboard):
    _module.register(app)

#: click's exception root, as the installed typer uses it (typer >= 0.24 bundles its own click).
_CLICK_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


def main() -> None:
    """The entry point: a usage mistake (a bad option value, a missing argument) is one line
    ``error: ...`` and exit status 1, like every other user mistake."""
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
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
