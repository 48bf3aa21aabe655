"""The store benchmarks still run: ``bench.store_ops`` and ``bench.store_throughput`` at tiny
sizes on SQLite and PostgreSQL (each starts its own PostgreSQL), as a user runs them. Only
that they finish and print every row they promise; never how fast (a shared machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.store_calls import protocol_calls
from bench.store_throughput import LABELS
from chongming_redis.stores.memory import InMemoryTaskStore
from tests.support.fixtures import require_postgres

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*args: str) -> str:
    """``python -m <args>`` from the checkout; its output (wide: rich wraps no row)."""
    env = {**os.environ, "COLUMNS": "300"}
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def call_names() -> list[str]:
    return [name for name, _ in protocol_calls(InMemoryTaskStore(), 1)]


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_store_ops_prints_every_call_and_the_summary(store: str) -> None:
    if store == "postgres":
        require_postgres()
    out = run_bench("bench.store_ops", f"--store={store}", "--ops=50", "--tasks=10000")
    title = {"sqlite": "SQLite (WAL, synchronous=FULL)", "postgres": "PostgreSQL"}[store]
    assert f"{title}: protocol calls" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    for name in call_names():
        assert sum(1 for row in rows if row.startswith(f"│ {name} ")) == 1, name
    for measure in ("query p50 at 1,000 tasks", "query p50 at 10,000 tasks",
                    "ratio large/small", "per pending task", "prune of 5,000 tasks"):  # fmt: skip
        assert measure in out, measure
    assert "Redis" not in out.replace("Redis: + nudge", "")  # only the store asked for


def test_store_throughput_drains_on_both_sql_stores_exactly_once() -> None:
    require_postgres()
    # Two idle tasks per store, not the default twelve (each waits 2.5 s of quiet): the
    # second comes after work and a quiet spell, the case the phase exists for, on both stores.
    out = run_bench("bench.store_throughput", "--stores=sqlite,postgres", "--tasks=100",
                    "--latency-seconds=0.4", "--rate=25", "--idle-tasks=2")  # fmt: skip
    drains, _, latencies = out.partition("submit -> start latency")
    latencies, _, idle = latencies.partition("idle submit -> start")
    for label in (LABELS["sqlite"], LABELS["postgres"]):
        for table, tasks in ((drains, "100"), (latencies, "10")):
            for workers in ("1", "2"):
                row = [c.strip() for c in _row(table, label, workers).split("│")[1:-1]]
                assert row[2] == tasks
                assert row[-1] == "yes"  # exactly one start per task, all SUCCEEDED
    for label in (LABELS["sqlite"], LABELS["postgres"]):  # each idle task started, once
        (idle_row,) = [line for line in idle.splitlines() if line.startswith(f"│ {label} ")]
        cells = [c.strip() for c in idle_row.split("│")[1:-1]]
        assert cells[1] == "2" and cells[-1] == "yes", idle_row
    assert "NO (" not in out


def _row(table: str, label: str, workers: str) -> str:
    rows = [line for line in table.splitlines() if line.startswith(f"│ {label} ")]
    found = [row for row in rows if row.split("│")[2].strip() == workers]
    assert len(found) == 1, (label, workers, table)
    return found[0]
