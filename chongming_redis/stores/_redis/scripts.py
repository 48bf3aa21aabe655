"""Loading the Lua scripts of ``lua/`` and mapping their reply codes to exceptions.

Scripts live in the package data (``chongming_redis.lua``, the repository's ``lua/``), one file
per protocol operation. A line ``--- @include "lib/name"`` is replaced by ``lua/lib/name.lua``;
each library is included once per script however often it is named, and a cycle is an error.
The first line may be a shebang (``#!lua`` or ``#!lua flags=no-writes``); it is kept first.
For servers that predate shebangs (Redis < 7, fakeredis) ``legacy=True`` drops it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path

_INCLUDE = re.compile(r'^--- @include "([A-Za-z0-9_/]+)"\s*$')


class ScriptLoadError(RuntimeError):
    """A script or library is missing, or the includes form a cycle."""


def read_source(name: str) -> str:
    """The raw text of ``lua/<name>.lua``: from the installed package (a wheel maps ``lua/``
    to ``chongming_redis.lua``), else from the source checkout (an editable install, which
    does not map nested package directories)."""
    try:
        return resources.files("chongming_redis.lua").joinpath(f"{name}.lua").read_text("utf-8")
    except (FileNotFoundError, ModuleNotFoundError):
        pass
    path = Path(__file__).resolve().parents[3] / "lua" / f"{name}.lua"
    try:
        return path.read_text("utf-8")
    except FileNotFoundError:
        raise ScriptLoadError(f"Lua script {name!r} not found in package data") from None


def expand(name: str, read: Callable[[str], str] = read_source) -> str:
    """The script ``name`` with every ``@include`` expanded (once each, cycles refused)."""
    included: set[str] = set()

    def walk(current: str, stack: tuple[str, ...]) -> list[str]:
        if current in stack:
            raise ScriptLoadError("include cycle: " + " -> ".join((*stack, current)))
        out: list[str] = []
        for line in read(current).splitlines():
            match = _INCLUDE.match(line)
            if match is None:
                out.append(line)
                continue
            target = match.group(1)
            if target in stack or target == current:
                raise ScriptLoadError("include cycle: " + " -> ".join((*stack, current, target)))
            if target not in included:
                included.add(target)
                out.extend(walk(target, (*stack, current)))
        return out

    lines = walk(name, ())
    shebang = [line for line in lines[:1] if line.startswith("#!")]
    body = lines[len(shebang) :]
    return "\n".join([*shebang, *body]) + "\n"


@cache
def script_text(name: str, *, legacy: bool = False) -> str:
    """The expanded text, ready for ``register_script``. Cached: files are read once."""
    text = expand(name)
    if legacy and text.startswith("#!"):
        text = "-- (shebang removed for a server without script flags)\n" + text.split("\n", 1)[1]
    return text


SCRIPT_NAMES: tuple[str, ...] = (
    "create",
    "save",
    "touch",
    "append",
    "submit_command",
    "claim_commands",
    "complete_command",
    "release_command",
    "prune",
    "expire_finished",
    "query",
    "pool_tick",
    "start_tasks",
    "upgrade_start_order",
    "commit_tasks",
    "commit_start",
    "changes",
    "task_commands",
    "write_schedule",
    "delete_schedule",
    "release_dependents",
)
READ_ONLY_SCRIPTS: frozenset[str] = frozenset({"query", "changes", "task_commands"})
