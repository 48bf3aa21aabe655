"""The stress harness (``chongming-redis stress``, ``python -m chongming_redis.stress``): a
short clean run under every fault kind, a run against a given ``--redis`` (the faults that need
a private server are skipped and reported), the negative control (an unsafe worker must be
caught), and the checkers on hand-made histories.

The runs are the bounded CI tier of the "exactly-once claims" stress test; the long run is
``chongming-redis stress --seconds 600`` (docs/reliability.md). The runs start from a temporary
directory: the harness ships in the package and needs nothing from the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stress import checkers
from chongming_redis.stress.app import UNSAFE_ENV
from chongming_redis.stress.faults import KINDS, schedule
from chongming_redis.stress.harness import upstream_of
from tests.conftest import require_redis_server
from tests.support.redis_server import RedisProc

T0 = datetime(2026, 1, 1, tzinfo=UTC)
P, R, S, L = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.LOST


def _run_stress(tmp_path: Path, *args: str, unsafe: str | None = None) -> tuple[int, dict]:
    require_redis_server()
    env = dict(os.environ)
    env.pop(UNSAFE_ENV, None)
    if unsafe:
        env[UNSAFE_ENV] = unsafe
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "chongming_redis.stress", *args, "--json", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_short_clean_run_fires_every_fault_and_finds_no_violation(
    tmp_path: Path, seed: int
) -> None:
    rc, report = _run_stress(
        tmp_path, "--workers=3", "--tasks=150", "--seconds=20", f"--seed={seed}"
    )
    assert report["violation_examples"] == []
    assert report["violations"] == 0
    assert report["faults_missing"] == {}, report["fault_log"]
    assert set(report["faults_fired"]) == set(KINDS)
    assert all(n >= 1 for n in report["faults_fired"].values())
    assert report["acked_writes_lost"] == 0 and report["final_restart"]
    assert report["submitted"] - report["filler_tasks"] == 150
    assert report["succeeded"] + report["stopped"] + report["lost"] + report["failed"] >= 140
    for key in (
        "submitted",
        "succeeded",
        "failed",
        "lost",
        "retried",
        "duplicate_starts",
        "duplicate_completions",
        "double_claims",
        "acked_writes_lost",
        "faults_fired",
        "seconds",
        "seed",
    ):
        assert key in report
    assert rc == 0


@pytest.mark.slow
@pytest.mark.redis
def test_a_given_redis_skips_the_private_server_faults_and_says_so(
    tmp_path: Path, redis_proc: RedisProc, namespace: str
) -> None:
    rc, report = _run_stress(
        tmp_path,
        f"--redis={redis_proc.url}",
        f"--namespace={namespace}",
        "--workers=2",
        "--tasks=40",
        "--seconds=8",
        "--seed=3",
    )
    assert report["violations"] == 0, report["violation_examples"]
    assert report["faults_missing"] == {}, report["fault_log"]
    assert set(report["faults_skipped"]) == {"redis_restart", "final_restart"}
    assert all("--redis" in why for why in report["faults_skipped"].values())
    assert "redis_restart" not in report["faults_scheduled"]
    assert set(report["faults_fired"]) == set(KINDS) - {"redis_restart"}
    assert not report["final_restart"]
    assert report["namespace"] == namespace
    assert rc == 0
    # the run deleted its namespace (and the app's lists) from the given Redis
    client = redis_proc.client()
    assert list(client.scan_iter(match="\\{" + namespace + "\\}:*")) == []
    assert list(client.scan_iter(match=f"stress:{namespace}:*")) == []


@pytest.mark.redis
def test_a_namespace_that_holds_data_is_refused(
    tmp_path: Path, redis_proc: RedisProc, namespace: str
) -> None:
    key = "{" + namespace + "}:meta"
    redis_proc.client().hset(key, "num_buckets", "16")
    proc = subprocess.run(
        [sys.executable, "-m", "chongming_redis.stress", f"--redis={redis_proc.url}",
         f"--namespace={namespace}", "--seconds=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"namespace {namespace!r} already holds data" in proc.stderr
    assert redis_proc.client().hget(key, "num_buckets") == b"16"  # untouched


def test_the_workers_url_keeps_credentials_and_database_and_points_at_the_proxy() -> None:
    up = upstream_of("redis://user:secret@redis.example:6380/3")
    assert (up.host, up.port) == ("redis.example", 6380)
    assert up.through(4242) == "redis://user:secret@127.0.0.1:4242/3"
    assert upstream_of("redis://localhost").port == 6379
    for url in ("rediss://redis.example:6380/0", "unix:///tmp/redis.sock"):
        assert upstream_of(url).host is None and upstream_of(url).why_not_proxied


@pytest.mark.slow
@pytest.mark.redis
def test_unsafe_double_run_is_caught(tmp_path: Path) -> None:
    rc, report = _run_stress(
        tmp_path, "--workers=2", "--tasks=30", "--seconds=8", "--seed=7", unsafe="double-run"
    )
    assert report["unsafe"] == "double-run"
    assert report["double_claims"] > 0
    assert report["duplicate_executions"] > 0
    assert report["violations"] > 0
    assert rc != 0


# -- the checkers on hand-made histories ------------------------------------------------------


def _t(
    task: str, version: int, frm: TaskStatus | None, to: TaskStatus, reason: str = ""
) -> Transition:
    return Transition(task, version, frm, to, T0 + timedelta(seconds=version), reason or None)


def _clean(task: str = "a") -> list[Transition]:
    return [
        _t(task, 1, None, P, "submitted by d"),
        _t(task, 2, P, R, "started by w1 (attempt 1)"),
        _t(task, 3, R, L, "lease of w1 expired"),
        _t(task, 4, L, P, "retry 2/3 after lost, in 1.0s"),
        _t(task, 5, P, R, "started by w2 (attempt 2)"),
        _t(task, 6, R, S),
    ]


def _snap(task: str, version: int, status: TaskStatus) -> TaskSnapshot:
    return TaskSnapshot(
        task_id=task,
        name="step",
        status=status,
        status_version=version,
        created_at=T0,
        updated_at=T0,
        attempt=2,
    )


def test_checkers_accept_a_clean_history_with_a_retry() -> None:
    histories = {"a": _clean()}
    finals = {"a": _snap("a", 6, S)}
    found = (
        checkers.check_starts(histories)
        + checkers.check_completions(histories)
        + checkers.check_cas_chain(histories, finals)
        + checkers.check_executions(["a|1|10|x", "a|2|11|y", "a|2|11|y"], ["a|2|11|y"], histories)
        + checkers.check_durability(["a"], finals)
    )
    assert found == []


def test_duplicate_start_of_one_attempt_is_reported() -> None:
    history = [
        *_clean()[:2],
        _t("a", 3, R, P, "handed back"),
        _t("a", 4, P, R, "started by w2 (attempt 1)"),
        _t("a", 5, R, S),
    ]
    found = checkers.check_starts({"a": history})
    assert [(v.kind, v.task_id) for v in found] == [("duplicate_starts", "a")]
    assert "attempt 1 started 2 times" in found[0].detail
    assert checkers.check_cas_chain({"a": history}, {"a": _snap("a", 5, S)}) == []


def test_two_cas_successes_from_one_expected_version_are_reported() -> None:
    history = [*_clean()[:2], _t("a", 3, R, S), _t("a", 3, R, L, "lease expired")]
    found = checkers.check_cas_chain({"a": history}, {"a": _snap("a", 3, S)})
    assert [(v.kind, v.task_id) for v in found] == [("cas_chain", "a")]
    assert "2 successes produced version 3" in found[0].detail
    assert checkers.check_starts({"a": history}) == []


def test_duplicate_completion_is_reported() -> None:
    history = [
        *_clean()[:2],
        _t("a", 3, R, S),
        _t("a", 4, S, R, "resume requested"),
        _t("a", 5, R, S),
    ]
    found = checkers.check_completions({"a": history})
    assert {v.kind for v in found} == {"duplicate_completions"}


def test_missing_acknowledged_task_is_reported_and_nothing_else() -> None:
    finals = {"a": _snap("a", 6, S), "b": None}
    found = checkers.check_durability(["a", "b"], finals)
    assert [(v.kind, v.task_id) for v in found] == [("acked_writes_lost", "b")]
    # an unacknowledged (indeterminate) submit that did not land is not a violation
    assert checkers.check_durability(["a"], finals) == []


def test_double_execution_of_one_attempt_is_reported() -> None:
    histories = {"a": _clean()}
    runs = ["a|1|10|x", "a|2|11|y", "a|2|12|z"]  # two processes began attempt 2
    effects = [
        "a|2|11|y",
        "a|2|12|z",
        "a|3|12|q",
    ]  # ... both passed the fence; attempt 3 never started
    found = checkers.check_executions(runs, effects, histories)
    assert checkers.count(found) == {"double_claims": 1, "duplicate_executions": 2}


def test_history_gap_and_entry_without_transition() -> None:
    history = [h for h in _clean() if h.version != 4]
    found = checkers.check_cas_chain({"a": history}, {"a": _snap("a", 6, S)})
    assert [v.kind for v in found] == ["history_gaps"]
    found = checkers.check_cas_chain({"a": _clean()}, {"a": _snap("a", 5, R)})
    assert [v.kind for v in found] == ["cas_chain"]


def test_commands_finished_but_claimable_are_reported() -> None:
    commands = {
        "c1": {"id": "c1", "f": "1", "o": "paused"},
        "c2": {"id": "c2", "o": "x"},
        "c3": {"id": "c3", "f": "1", "o": "stopped"},
    }
    found = checkers.check_commands(commands, queued=["c3"], leased=[])
    assert sorted((v.kind, v.task_id) for v in found) == [
        ("command_state", "c2"),
        ("command_state", "c3"),
    ]


def test_schedule_is_seeded_and_covers_every_kind() -> None:
    plan = schedule(5, 60)
    assert plan == schedule(5, 60)
    assert plan != schedule(6, 60)
    assert {f.kind for f in plan} == set(KINDS)
    assert len(plan) == len(KINDS) + 6
    assert all(0 < f.at <= 39 for f in plan)


def test_missing_creation_entry_is_a_gap_not_a_fork() -> None:
    history = _clean()[1:]
    found = checkers.check_cas_chain({"a": history}, {"a": _snap("a", 6, S)})
    assert [v.kind for v in found] == ["history_gaps"]
