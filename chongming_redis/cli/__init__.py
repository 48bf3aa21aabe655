"""The ``chongming-redis`` command line (the console script ``chongming_redis.cli:main``;
``python -m chongming_redis.cli`` runs the same).

``root.py`` holds the Typer app and ``main``; each command module (``worker``, ``submit``,
``read``, ``control``, ``tools``, ``dashboard``) registers its commands one way
(``registry.py``). ``common.py`` holds the shared options and the user-error handling,
``render.py`` the tables, ``json_output.py`` the ``--json`` shapes, ``worker_parent.py`` the
parent of ``worker --processes N``, ``log_writer.py`` its children's log lines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chongming_redis.cli.root import main

if TYPE_CHECKING:
    from chongming_redis.cli.root import app

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    """``app`` (every command) is built at its first use: ``main`` builds only the command it
    runs (``root.py``)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from chongming_redis.cli import root

    return root.app
