"""A cold ``chongming-redis worker`` imports only what it runs (issue 31: the first task within
0.3 s of the spawn; ``bench/cold_start.py`` measures it): neither the other commands' modules,
nor the dashboard, the metrics, the producer client and its parameter checks (jsonschema), the
in-memory store, nor rich (the worker prints its lines without it). A real worker process runs
a task that reports the modules loaded by then; no timing is asserted here.

``redis.asyncio`` is not in the list: redis-py itself imports it (``redis/__init__.py`` and its
sync ``commands/core.py``, in redis-py 8), whatever the worker imports.

Also: ``main`` builds only the command it runs, so ``COMMAND_MODULES`` must name every command
of every module; and every name of ``chongming_redis.__all__`` (all imported lazily) is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer

import chongming_redis
from chongming_redis.cli import root
from chongming_redis.client.client import Client
from tests.support.redis_server import RedisProc

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[1]
APP = "tests.support.modules_app:app"

#: Modules (and their submodules) a worker that runs a task without a parameter model does
#: not need, each of which it once imported.
NOT_IN_A_WORKER = (
    "jsonschema",
    "rich",
    "prometheus_client",
    "starlette",
    "uvicorn",
    "jinja2",
    "psycopg",
    "chongming_redis.dashboard",
    "chongming_redis.metrics",
    "chongming_redis.client",
    "chongming_redis.feed",
    "chongming_redis.stores.memory",
    "chongming_redis.stores.sqlite",
    "chongming_redis.stores.postgres",
    *(f"chongming_redis.cli.{m}" for m in root.COMMAND_MODULES if m != "worker"),
    "chongming_redis.cli.json_output",
    "chongming_redis.cli.render",
)


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in NOT_IN_A_WORKER)]


def test_a_worker_runs_its_first_task_without_the_heavy_modules(
    redis_proc: RedisProc, namespace: str, tmp_path: Path
) -> None:
    report = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "chongming_redis.cli", "worker", APP, "--redis", redis_proc.url,
         "--namespace", namespace],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with Client.from_url(redis_proc.url, namespace=namespace) as client:
            client.submit("loaded", {"path": str(report)})
        deadline = time.monotonic() + 30
        while not report.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no task ran within 30 s"
            time.sleep(0.02)
    finally:
        proc.terminate()
        stderr = proc.communicate(timeout=30)[1]
    modules = json.loads(report.read_text())
    assert "chongming_redis.runtime.controller" in modules, modules  # the probe saw a worker
    assert heavy(modules) == [], stderr


def test_the_check_above_sees_a_heavy_module() -> None:
    """Its teeth: the same filter on a process that imported the producer client."""
    code = ("import sys, json; import chongming_redis.client.client; "
            "print(json.dumps(list(sys.modules)))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    found = heavy(json.loads(done.stdout))
    assert "chongming_redis.client.client" in found and "jsonschema" in found


def commands_of(app: typer.Typer) -> list[str]:
    return list(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("module", list(root.COMMAND_MODULES))
def test_command_modules_names_the_commands_of_each_module(module: str) -> None:
    assert commands_of(root.build_app([module])) == list(root.COMMAND_MODULES[module])


def test_the_full_app_has_every_command_once() -> None:
    expected = [name for names in root.COMMAND_MODULES.values() for name in names]
    assert sorted(commands_of(root.app)) == sorted(expected) == sorted(set(expected))


@pytest.mark.parametrize(
    ("args", "commands"),
    [
        (["worker", APP, "--redis", "redis://x"], ["worker"]),
        (["--version", "tasks"], ["tasks", "show", "stats", "limits", "reconcile", "changes"]),
        (["schedules", "list"], ["schedules"]),
        ([], None),
        (["--help"], None),
        (["no-such-command"], None),
    ],
)
def test_main_builds_the_named_command_alone_else_every_command(
    args: list[str], commands: list[str] | None
) -> None:
    every = [name for names in root.COMMAND_MODULES.values() for name in names]
    assert sorted(commands_of(root.app_for(args))) == sorted(commands or every)


def test_every_public_name_is_importable_from_the_package() -> None:
    code = (
        "import chongming_redis, sys\n"
        "assert not [m for m in sys.modules if m.startswith('chongming_redis.')], sys.modules\n"
        "from chongming_redis import *\n"
        "missing = [n for n in chongming_redis.__all__ if n not in globals()]\n"
        "assert not missing, missing\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    assert sorted(chongming_redis._LAZY) == sorted(chongming_redis.__all__)
    for name in chongming_redis.__all__:
        value = getattr(chongming_redis, name)
        assert getattr(value, "__name__", name) == name
    assert set(chongming_redis.__all__) <= set(dir(chongming_redis))
    with pytest.raises(AttributeError, match="no_such_name"):
        chongming_redis.no_such_name  # noqa: B018
