"""The ``chongming-redis`` command line."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)


@app.callback()
def _root() -> None:
    """chongming-redis: task state you can trust, inspect and control."""


@app.command()
def demo() -> None:
    """Run the example: create, claim and control tasks on a store, then print the audit."""
    from chongming_redis.demo import run_demo

    run_demo()


def main() -> None:
    app()
