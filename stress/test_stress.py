"""The stress harness (``chongming-redis stress``, ``python -m chongming_redis.stress``): a
short clean run under every fault kind, a run against a given ``--redis`` (the faults that need
a private server are skipped and reported), the negative controls (unsafe workers must be
caught: a double run, a start without compare-and-set, the task policies ignored), and the
checkers on hand-made histories (the task policies' in ``test_policy_checks.py``).

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
from _pytest.capture import CaptureFixture

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stress import __main__ as stress_main
from chongming_redis.stress import checkers
from chongming_redis.stress.app import UNSAFE_ENV, keys_pattern
from chongming_redis.stress.faults import KINDS, schedule
from chongming_redis.stress.harness import Options, libfaketime, upstream_of
from tests.support.fixtures import require_redis_server
from tests.support.redis_server import RedisProc

T0 = datetime(2026, 1, 1, tzinfo=UTC)
P, R, S, L = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.LOST


#: the faults a run on this machine cannot apply (libfaketime missing: no clock_skew)
NOT_HERE = set() if libfaketime() else {"clock_skew"}


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
@pytest.mark.parametrize("seed", [1, 2])  # two more seeds in the matrix test below
def test_short_clean_run_fires_every_fault_and_finds_no_violation(
    tmp_path: Path, seed: int
) -> None:
    rc, report = _run_stress(
        tmp_path, "--workers=3", "--tasks=150", "--seconds=20", f"--seed={seed}"
    )
    assert report["violation_examples"] == []
    assert report["violations"] == 0
    assert report["faults_missing"] == {}, report["fault_log"]
    assert set(report["faults_fired"]) == set(KINDS) - NOT_HERE
    assert all(n >= 1 for n in report["faults_fired"].values())
    if "clock_skew" not in NOT_HERE:  # a worker really ran tasks with its clock 300 s off
        skews = [f for f in report["fault_log"] if f["kind"] == "clock_skew"]
        assert skews and all(f["fired"] and "300" in f["detail"] for f in skews), skews
    assert report["acked_writes_lost"] == 0 and report["final_restart"]
    check_linearizable(report)
    beside = report["filler_tasks"] + report["graph_tasks"]
    assert report["submitted"] - beside == 150, report["unacknowledged_submits"]
    assert report["graph_tasks"] == 162  # 5 diamonds, 5 failing parents' clumps, the fan-out
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
        # the task policies (issue 25)
        "attempts_exceeded",
        "timeout_overrun",
        "removed_early",
        "unique_duplicates",
        "unique_orphans",
        "retries_by_cause",
        "timeouts",
        "expired",
        "unique_submits",
        "policy_bounds",
        # the schedules (issue 27)
        "tick_double_fires",
        "tick_gaps",
        "early_ticks",
        "ticks_fired",
    ):
        assert key in report
    # the schedule fired through the faults (a tick a second, over a 20 s run)
    assert report["ticks_fired"] >= 5, report
    # ... really in use: a policy retry, a timeout, an expiry, both kinds of unique answers
    assert report["retries_by_cause"].get("failed (Flaky)", 0) >= 1, report["retries_by_cause"]
    assert report["timeouts"] >= 1 and report["expired"] >= 1
    assert report["unique_created"] >= 1 and report["unique_returned_holder"] >= 1
    assert report["policy_bounds"]["timeout_slack"] == 5.0  # grace 2 + reconcile 1 + lease 2
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
    assert set(report["faults_skipped"]) == {"redis_restart", "final_restart"} | NOT_HERE
    assert all("--redis" in why for k, why in report["faults_skipped"].items() if k not in NOT_HERE)
    assert "redis_restart" not in report["faults_scheduled"]
    assert set(report["faults_fired"]) == set(KINDS) - {"redis_restart"} - NOT_HERE
    assert not report["final_restart"]
    assert report["namespace"] == namespace
    assert rc == 0
    # the run deleted its namespace (and the app's lists) from the given Redis
    client = redis_proc.client()
    assert list(client.scan_iter(match="\\{" + namespace + "\\}:*")) == []
    assert list(client.scan_iter(match=keys_pattern(namespace))) == []


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


@pytest.mark.slow
@pytest.mark.redis
def test_unsafe_start_without_compare_and_set_is_caught(tmp_path: Path) -> None:
    # the second negative control: workers start tasks with a blind write (no compare-and-set)
    rc, report = _run_stress(
        tmp_path, "--workers=2", "--tasks=30", "--seconds=8", "--seed=7", unsafe="skip-cas"
    )
    assert report["unsafe"] == "skip-cas"
    assert report["duplicate_starts"] > 0, report["violation_examples"]
    assert report["double_claims"] > 0  # both starters began the attempt
    check_not_linearizable(report)
    assert report["violations"] > 0
    assert rc != 0


@pytest.mark.slow
@pytest.mark.redis
def test_unsafe_compare_and_set_in_two_steps_is_not_linearizable(tmp_path: Path) -> None:
    # the sixth negative control: the workers' save checks the version, pauses, then writes
    # blindly, and every task move is such a save (stress/two_step.py)
    rc, report = _run_stress(
        tmp_path, "--workers=2", "--tasks=30", "--seconds=8", "--seed=7", unsafe="two-step-save"
    )
    assert report["unsafe"] == "two-step-save"
    check_not_linearizable(report)
    assert any("save v" in line for v in report["linearizability"]["violations"]
               for line in v["example"])  # fmt: skip
    assert rc != 0


def check_linearizable(report: dict) -> None:
    """A clean run's linearizability section: every recorded history checked and legal,
    the driver's and the workers' processes recorded."""
    lin = report["linearizability"]
    assert lin["violations"] == [] and report["not_linearizable"] == 0
    assert lin["unknown"] == [], lin["unknown"]  # over the budget: not a pass
    assert lin["histories"] >= report["tasks_created"] and lin["operations"] > lin["histories"]
    assert lin["commands"]["histories"] >= report["commands_sent"]
    assert lin["processes"] >= 1 + report["workers"]


def check_not_linearizable(report: dict) -> None:
    """A negative control's: violations, each with its minimal example, counted as the
    run's ``not_linearizable`` and shown on the matrix line."""
    found = report["linearizability"]["violations"]
    assert report["not_linearizable"] == len(found) > 0, report["violation_examples"]
    assert all(v["kind"] in ("not_linearizable", "unexplained_start") for v in found)
    assert all(v["example"] for v in found)
    assert "cannot be linearized" in "\n".join(line for v in found for line in v["example"])
    assert "not linearizable" in stress_main.summary(report)


@pytest.mark.slow
@pytest.mark.redis
def test_unsafe_workers_ignoring_the_task_policies_are_caught(tmp_path: Path) -> None:
    # the third negative control: workers that retry past the frozen policy, enforce no
    # timeout and expire a minute early, and a driver that forgets each unique record
    # 16 s: a silent attempt (9 s without a checkpoint) that begins in the first 9.5 s runs
    # past its bound (1 s + 5 s slack + 0.5 s) before the workers stop
    rc, report = _run_stress(
        tmp_path, "--workers=2", "--tasks=60", "--seconds=16", "--seed=7",
        unsafe="ignore-policies",
    )  # fmt: skip
    assert report["unsafe"] == "ignore-policies"
    for kind in ("attempts_exceeded", "timeout_overrun", "removed_early", "unique_duplicates"):
        assert report[kind] > 0, (kind, report["violation_examples"])
    assert report["violations"] > 0
    assert rc != 0


@pytest.mark.slow
@pytest.mark.redis
def test_an_unsafe_driver_ignoring_the_parents_is_caught(tmp_path: Path) -> None:
    # the fifth negative control: the graphs submitted without their edges, as a store that
    # keeps no dependencies would run them (60 tasks: four graphs and the wide fan-out)
    rc, report = _run_stress(
        tmp_path, "--workers=2", "--tasks=60", "--seconds=8", "--seed=7", unsafe="ignore-parents"
    )
    assert report["unsafe"] == "ignore-parents"
    assert report["graph_children"] >= 120 + 1 + 4 * 3
    assert report["early_releases"] >= report["graph_children"], report["violation_examples"]
    assert report["children_released"] == 0
    assert rc != 0


# -- the seed matrix --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.redis
def test_a_seed_matrix_prints_one_line_per_seed(tmp_path: Path) -> None:
    require_redis_server()
    out = tmp_path / "reports.json"
    proc = subprocess.run(
        [sys.executable, "-m", "chongming_redis.stress", "--seeds=4..5", "--seconds=8",
         "--workers=2", "--tasks=20", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["seed    4", "seed    5"], proc.stdout
    examples = [r.get("violation_examples") for r in json.loads(out.read_text())]
    for line in lines[:2]:
        assert "PASS" in line and "violations 0" in line, (line, examples)  # which task, how
        scheduled = line.split("faults ")[1].split()[0]  # fired/scheduled
        fired, planned = map(int, scheduled.split("/"))
        assert fired == planned >= len(KINDS) - len(NOT_HERE), line
    assert lines[2].startswith("2 seeds: 2 passed, 0 failed; violations 0"), proc.stdout
    reports = json.loads(out.read_text())
    assert [r["seed"] for r in reports] == [4, 5] and all(r["ok"] for r in reports)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _report(seed: int, violations: int = 0, missing: int = 0) -> dict[str, object]:
    report: dict[str, object] = {k: 0 for k in stress_main.VIOLATION_KINDS}
    report.update(
        seed=seed, submitted=10, succeeded=10, stopped=0, failed=0, lost=0, unfinished=0,
        seconds=1.0, violations=violations, duplicate_starts=violations,
        faults_scheduled={"worker_kill": 2}, faults_fired={"worker_kill": 2 - missing},
        faults_missing={"worker_kill": missing} if missing else {},
        ok=violations == 0 and not missing,
    )  # fmt: skip
    return report


def test_a_run_where_no_task_succeeded_fails_however_clean_its_records() -> None:
    from chongming_redis.stress.report import verdict

    clean = _report(1)
    assert verdict(clean)
    broken = {**clean, "succeeded": 0, "failed": 10, "failure_types": {"ResponseError": 10}}
    assert not verdict(broken)  # every task failed (e.g. CROSSSLOT): proves nothing
    assert not verdict({**clean, "violations": 1})
    assert not verdict({**clean, "faults_missing": {"worker_kill": 1}})
    assert verdict({**clean, "submitted": 0, "succeeded": 0})  # nothing asked, nothing owed
    line = stress_main.summary({**broken, "ok": False})
    assert "FAIL" in line and "no task succeeded" in line and "failures ResponseError=10" in line


def test_the_matrix_fails_when_one_seed_has_a_violation_or_an_unfired_fault(
    monkeypatch: pytest.MonkeyPatch, capsys: CaptureFixture[str]
) -> None:
    outcomes = {1: _report(1), 2: _report(2, violations=1), 3: _report(3, missing=1)}
    monkeypatch.setattr(stress_main, "run", lambda opts: outcomes[opts.seed])
    assert stress_main.matrix(Options(), [1], None) == 0
    assert stress_main.matrix(Options(), [1, 2], None) == 1
    assert stress_main.matrix(Options(), [1, 3], None) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("seed    1: PASS  tasks 10") and "faults 2/2 fired" in lines[0]
    assert lines[1] == "1 seeds: 1 passed, 0 failed; violations 0, faults 2/2 fired"
    assert "FAIL" in lines[3] and "violations 1" in lines[3] and "duplicate_starts=1" in lines[3]
    assert lines[4].startswith("2 seeds: 1 passed, 1 failed")
    assert "faults 1/2 fired" in lines[6] and "missing worker_kill=1" in lines[6], lines
    assert lines[7].startswith("2 seeds: 1 passed, 1 failed")


def test_seed_ranges() -> None:
    assert stress_main.seed_range("3..5") == [3, 4, 5]
    assert stress_main.seed_range("7..7") == [7]
    for bad in ("5..3", "5", "a..b", "1..", "..2"):
        with pytest.raises(Exception, match=r"A\.\.B"):
            stress_main.seed_range(bad)
    with pytest.raises(SystemExit):
        stress_main.parse(["--seed=3", "--seeds=1..2"])


def test_a_command_line_mistake_is_one_error_line_and_exit_1_as_on_every_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: argparse's usage block and exit 2 (the status of a run that could not start),
    '--workers 0' accepted, rst markup in --help and no example."""
    for bad, said in ((["--workers=x"], "--workers: expected a number, not 'x'"),
                      (["--workers=0"], "--workers: must be at least 1, not 0"),
                      (["--tasks=0"], "--tasks: must be at least 1"),
                      (["--seconds=0"], "--seconds: must be at least 1"),
                      (["--bogus"], "unrecognized arguments: --bogus")):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            stress_main.parse(bad)
        assert exited.value.code == 1, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and said in err, err
        assert "(see: chongming-redis stress --help)" in err
    with pytest.raises(SystemExit):
        stress_main.parse(["--help"])
    shown = capsys.readouterr().out
    assert "``" not in shown and "example: chongming-redis stress --workers 3" in shown


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
        + checkers.check_executions(["a|1|w1|x", "a|2|w2|y", "a|2|w2|y"], ["a|2|w2|y"], histories)
        + checkers.check_durability(["a"], finals)
    )
    assert found == []


def test_duplicate_start_of_one_attempt_is_reported_and_a_hand_back_allows_one_more() -> None:
    history = [
        *_clean()[:2],
        _t("a", 3, R, P, "lease of w1 released"),
        _t("a", 4, P, R, "started by w2 (attempt 1)"),
        _t("a", 5, R, S),
    ]
    found = checkers.check_starts({"a": history})
    assert [(v.kind, v.task_id) for v in found] == [("duplicate_starts", "a")]
    assert "attempt 1 started 2 times, handed back 0" in found[0].detail
    assert checkers.check_cas_chain({"a": history}, {"a": _snap("a", 5, S)}) == []
    # a hand-back keeps the attempt: the next start runs it again, and only that one
    handed = [*history[:2], _t("a", 3, R, P, "handed back at shutdown"), *history[3:]]
    assert checkers.check_starts({"a": handed}) == []
    twice = [*handed[:4], _t("a", 5, R, P, "lease of w2 released"),
             _t("a", 6, P, R, "started by w3 (attempt 1)")]  # fmt: skip
    (again,) = checkers.check_starts({"a": twice})
    assert "attempt 1 started 3 times, handed back 1" in again.detail


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


def test_double_execution_of_one_run_is_reported() -> None:
    histories = {"a": _clean()}
    runs = ["a|1|w1|x", "a|2|w2|y", "a|2|w2|z", "a|2|w3|q"]  # w2 began attempt 2 twice; w3
    effects = ["a|2|w2|y", "a|2|w2|z", "a|3|w2|r"]  # both passed the fence; 3 never started
    found = checkers.check_executions(runs, effects, histories)
    assert checkers.count(found) == {"double_claims": 3, "duplicate_executions": 2}
    assert sorted(v.detail for v in found if v.kind == "double_claims") == [
        "attempt 2 began on 2 workers, handed back 0: ['w2', 'w3']",
        "attempt 2 began on w3, which the history never started",
        "attempt 2 on w2 began 2 times: ['y', 'z']",
    ]
    # a hand-back's next run of the same attempt, on another worker, is its own run
    handed = [*_clean(), _t("a", 7, R, P, "handed back at shutdown")]
    handed[5] = _t("a", 6, R, P, "handed back at shutdown")
    handed[6] = _t("a", 7, P, R, "started by w3 (attempt 2)")
    runs = ["a|1|w1|x", "a|2|w2|y", "a|2|w3|z"]
    assert checkers.check_executions(runs, ["a|2|w2|y", "a|2|w3|z"], {"a": handed}) == []
    # a task whose history is gone is judged on the counts alone
    assert checkers.check_executions(["a|2|w9|y"], [], {}, unknown={"a"}) == []


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
