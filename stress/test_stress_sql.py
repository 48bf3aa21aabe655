"""The stress harness on the SQL stores (``chongming-redis stress --store``): a short clean run on
a new SQLite file and one on a private PostgreSQL (real worker processes, the faults that apply
to each store fired, the others skipped with their reasons), the fenced effect's transaction
on both stores (it refuses a stale attempt, owner or status), and the ``--store`` mistakes
refused with one ``error:`` line before anything starts.

The runs are bounded (3 workers, 60 tasks, 8 s: about 20 s each); longer ones are manual
(docs/reliability.md, "The stress run on SQLite and PostgreSQL").
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _pytest.capture import CaptureFixture

from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.postgres import PostgresTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from chongming_redis.stress import __main__ as stress_main
from chongming_redis.stress import sql_records
from chongming_redis.stress.app import UNSAFE_ENV
from chongming_redis.stress.faults import PROXY_KINDS
from chongming_redis.stress.harness import libfaketime
from tests.support.fixtures import require_postgres, require_redis_server

#: the faults a run on this machine cannot apply (libfaketime missing: no clock_skew)
NOT_HERE = set() if libfaketime() else {"clock_skew"}
#: every store's faults: the workers' processes and clocks
WORKER_KINDS = {"worker_kill", "lease_holder_pause", "clock_skew"}
RUN = ("--workers=3", "--tasks=60", "--seconds=8")


def _run_stress(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    require_redis_server()  # the stress app's records go to a private side Redis
    env = dict(os.environ)
    env.pop(UNSAFE_ENV, None)
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "chongming_redis.stress", *args, "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())


def _assert_clean(rc: int, report: dict[str, Any], fired: set[str]) -> None:
    assert report["violation_examples"] == []
    assert report["violations"] == 0
    assert report["faults_missing"] == {}, report["fault_log"]
    assert set(report["faults_fired"]) == fired - NOT_HERE
    assert all(n >= 1 for n in report["faults_fired"].values()), report["fault_log"]
    assert report["succeeded"] > 0 and report["fenced_effects"] > 0
    assert report["unfinished"] == 0
    # the lease audit is Redis's alone: skipped with its reason, not reported as zero
    assert "command_lease_audit" in report["checks_skipped"]
    assert "audit_claims" not in report
    # the linearizability check runs on every store: every recorded history legal
    lin = report["linearizability"]
    assert lin["violations"] == [] and lin["unknown"] == [], lin
    assert lin["histories"] >= report["tasks_created"] and lin["processes"] > report["workers"]
    assert rc == 0


@pytest.mark.slow
def test_a_sqlite_run_fires_the_worker_faults_and_skips_the_server_ones(tmp_path: Path) -> None:
    database = tmp_path / "stress.sqlite3"
    rc, report = _run_stress(tmp_path, f"--store=sqlite://{database}", *RUN, "--seed=1")
    _assert_clean(rc, report, WORKER_KINDS - {"clock_skew"})
    assert report["store"] == "sqlite"
    skipped = report["faults_skipped"]
    assert set(skipped) == {*PROXY_KINDS, "server_restart", "final_restart", "clock_skew"}
    assert "SQLite has no server" in skipped["server_restart"]
    assert all("SQLite" in why for why in skipped.values())
    assert not report["final_restart"]
    assert not database.exists()  # the run's own file, deleted at the end


@pytest.mark.slow
def test_a_private_postgresql_run_fires_every_fault_that_applies(tmp_path: Path) -> None:
    require_postgres()
    rc, report = _run_stress(tmp_path, "--store=postgresql", *RUN, "--seed=2")
    fired = WORKER_KINDS | {"proxy_latency", "reset_connections", "server_restart"}
    _assert_clean(rc, report, fired)
    assert report["store"] == "postgresql"
    assert set(report["faults_skipped"]) == {"drop_reply"} | NOT_HERE
    assert "raw bytes" in report["faults_skipped"]["drop_reply"]
    assert report["final_restart"]  # kill -9 of the server, then everything read back
    assert report["acked_writes_lost"] == 0


# -- the fenced effect: one transaction with the read of the task's row ----------------------


def _running(task_id: str, owner: str, attempt: int) -> TaskSnapshot:
    now = datetime.now(UTC)
    return TaskSnapshot(
        task_id=task_id, name="step", status=TaskStatus.RUNNING, status_version=2,
        created_at=now, updated_at=now, lease_owner=owner, lease_until=now + timedelta(seconds=60),
        attempt=attempt,
    )  # fmt: skip


def _check_fence(store: Any, url: str, schema: str) -> None:
    store.create(_running("t1", "w-1", 2))
    sql_records.create_effects_table(url, schema)
    insert = sql_records.fenced_insert
    assert insert(url, schema, "t1", 2, "w-1", "t1|2|w-1|aa")
    assert insert(url, schema, "t1", 2, "w-1", "t1|2|w-1|aa")  # a retry: inserted once
    assert not insert(url, schema, "t1", 1, "w-1", "t1|1|w-1|bb")  # an older attempt
    assert not insert(url, schema, "t1", 2, "w-2", "t1|2|w-2|cc")  # another owner
    assert not insert(url, schema, "nope", 2, "w-1", "nope|2|w-1|dd")  # no such task
    snap = store.get("t1")
    done = dataclasses.replace(snap, status=TaskStatus.SUCCEEDED, status_version=3)
    store.save(done, expect_version=2)
    assert not insert(url, schema, "t1", 2, "w-1", "t1|2|w-1|ee")  # no longer running
    assert sql_records.read_effects(url, schema) == ["t1|2|w-1|aa"]


def test_the_fenced_effect_on_sqlite_writes_only_for_the_running_attempt(tmp_path: Path) -> None:
    path = tmp_path / "fence.sqlite3"
    store = SqliteTaskStore(path)
    try:
        _check_fence(store, f"sqlite://{path}", "default")
    finally:
        store.close()


def test_the_fenced_effect_on_postgresql_writes_only_for_the_running_attempt(
    postgres_proc: PostgresProc,
) -> None:
    schema = f"fence-{os.getpid()}"
    store = PostgresTaskStore(postgres_proc.dsn, schema=schema)
    try:
        _check_fence(store, postgres_proc.dsn, schema)
    finally:
        store.drop_schema()
        store.close()


# -- --store mistakes: one error line, exit status 1 (2 for a run that cannot start) ---------


def _main(args: list[str], capsys: CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        status = stress_main.main(args)
    except SystemExit as exc:
        status = int(exc.code or 0)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return status, lines


@pytest.mark.parametrize(
    ("store", "says"),
    [
        ("mongodb://host/db", "unknown store URL"),
        ("sqlite:///no/such/directory/x.sqlite3", "no directory /no/such/directory"),
        ("redis://127.0.0.1:6379/0", "--redis URL"),
        ("sqlite::memory:", "in-memory"),
    ],
)
def test_a_bad_store_is_one_error_line(store: str, says: str, capsys: CaptureFixture[str]) -> None:
    status, lines = _main([f"--store={store}"], capsys)
    assert status == 1
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


def test_an_existing_sqlite_file_is_refused(tmp_path: Path, capsys: CaptureFixture[str]) -> None:
    existing = tmp_path / "mine.sqlite3"
    existing.write_bytes(b"")
    status, lines = _main([f"--store=sqlite://{existing}"], capsys)
    assert status == 1 and len(lines) == 1 and "exists" in lines[0], lines
    assert existing.exists()


def test_store_and_redis_together_are_refused(capsys: CaptureFixture[str]) -> None:
    status, lines = _main(["--store=sqlite", "--redis=redis://127.0.0.1:1/0"], capsys)
    assert status == 1 and len(lines) == 1 and "without --redis" in lines[0], lines


def test_a_redis_only_negative_control_is_refused_on_sql(
    tmp_path: Path, capsys: CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UNSAFE_ENV, "skip-cas")
    status, lines = _main([f"--store=sqlite://{tmp_path / 'x.sqlite3'}"], capsys)
    assert status == 2 and len(lines) == 1, lines
    assert "'skip-cas' patches the Redis store" in lines[0]
    assert not (tmp_path / "x.sqlite3").exists()  # refused before anything started
