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
from importlib.abc import Traversable
from pathlib import Path

_INCLUDE = re.compile(r'^--- @include "([A-Za-z0-9_/]+)"\s*$')


class ScriptLoadError(RuntimeError):
    """A script or library is missing, or the includes form a cycle."""


@cache
def _package_data() -> Traversable | None:
    """The installed package's ``chongming_redis.lua``; ``None`` in a source checkout. Looked
    up once: a failed look-up walks every import finder."""
    try:
        return resources.files("chongming_redis.lua")
    except ModuleNotFoundError:
        return None


@cache
def _checkout() -> Path:
    """The source checkout this module runs from (resolved once: a ``realpath`` per file read
    cost ~3 ms of a start)."""
    return Path(__file__).resolve().parents[3]


@cache
def read_source(name: str) -> str:
    """The raw text of ``lua/<name>.lua``: from the installed package (a wheel maps ``lua/``
    to ``chongming_redis.lua``), else from the source checkout (an editable install, which
    does not map nested package directories). Cached: the 21 scripts include their libraries
    119 times in all, each look-up a trip through the import system (a worker's start paid
    ~17 ms for them)."""
    package = _package_data()
    if package is not None:
        try:
            return package.joinpath(f"{name}.lua").read_text("utf-8")
        except FileNotFoundError:
            pass
    path = _checkout() / "lua" / f"{name}.lua"
    try:
        return path.read_text("utf-8")
    except FileNotFoundError:
        raise ScriptLoadError(f"Lua script {name!r} not found in package data") from None


@cache
def _segments(text: str) -> tuple[tuple[str | None, str], ...]:
    """``text`` as its runs of plain lines, ``(None, the lines joined)``, and its includes,
    ``(target, the line)``. Cached by text: a library is split once however many scripts
    include it (line by line, the 21 scripts are 17,000 lines: ~8 ms of a worker's start)."""
    segments: list[tuple[str | None, str]] = []
    plain: list[str] = []
    for line in text.splitlines():
        match = _INCLUDE.match(line) if line.startswith("--- @include") else None
        if match is None:
            plain.append(line)
            continue
        if plain:
            segments.append((None, "\n".join(plain)))
            plain = []
        segments.append((match.group(1), line))
    if plain:
        segments.append((None, "\n".join(plain)))
    return tuple(segments)


def expand(name: str, read: Callable[[str], str] = read_source) -> str:
    """The script ``name`` with every ``@include`` expanded (once each, cycles refused). A
    shebang, the first line of the script's own file, stays the first line."""
    included: set[str] = set()

    def walk(current: str, stack: tuple[str, ...]) -> list[str]:
        if current in stack:
            raise ScriptLoadError("include cycle: " + " -> ".join((*stack, current)))
        out: list[str] = []
        for target, text in _segments(read(current)):
            if target is None:
                out.append(text)
                continue
            if target in stack or target == current:
                raise ScriptLoadError("include cycle: " + " -> ".join((*stack, current, target)))
            if target not in included:
                included.add(target)
                out.extend(walk(target, (*stack, current)))
        return out

    return "\n".join(walk(name, ())) + "\n"


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
