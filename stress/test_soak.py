"""The soak run (``chongming-redis stress --soak MINUTES``, ``chongming_redis/stress/soak.py``):
its fault plan and verdict on hand-made inputs, and a one-minute soak of real processes whose
report must have its samples and verdict, faults through the whole window, no violation, and
tasks removed while it ran. The 30-minute soak is manual (docs/reliability.md, "Soak")."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.stress.app import UNSAFE_ENV
from chongming_redis.stress.faults import KINDS
from chongming_redis.stress.soak import SoakPlan, fault_plan, grew, kind_of, summarize
from tests.support.fixtures import require_redis_server


def test_the_fault_plan_deals_every_kind_through_the_whole_window() -> None:
    plan = fault_plan(7, 1800, KINDS, (10.0, 20.0))
    times = [f.at for f in plan]
    assert times == sorted(times)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 10.0 and max(gaps) <= 20.0
    assert times[-1] > 1800 - 5 - 20 and times[-1] <= 1800 - 5
    # every kind once in each round of len(KINDS) faults
    for at in range(0, len(plan) - len(KINDS) + 1, len(KINDS)):
        assert sorted(f.kind for f in plan[at : at + len(KINDS)]) == sorted(KINDS)
    assert fault_plan(7, 1800, KINDS, (10.0, 20.0)) == plan  # the seed decides it


def test_a_short_soak_samples_and_faults_more_often() -> None:
    assert SoakPlan.for_minutes(30).sample_every == 20.0
    assert SoakPlan.for_minutes(30).retention == 60.0
    short = SoakPlan.for_minutes(1, rate=2)
    assert (short.sample_every, short.fault_spacing, short.tasks) == (5.0, (4.0, 8.0), 120)


def test_kinds_of_keys() -> None:
    root = "{ns}:"
    assert kind_of("{ns}:t:a:b", root) == "t"
    assert kind_of("{ns}:feed", root) == "feed"
    assert kind_of("{ns}:ix:succeeded:3:step", root) == "ix"
    assert kind_of("stress:{ns}:runs", root) == "stress:runs"


def _sample(t: float, stored: int, per_kind: dict[str, int], harness: int = 0,
            tombstones: int = 0) -> dict[str, Any]:  # fmt: skip
    store_bytes = sum(per_kind.values())
    return {"tombstones": tombstones, "t": t, "stored": stored,
            "used_memory": 1_000_000 + store_bytes + harness,
            "harness_bytes": harness, "store_bytes": store_bytes,
            "per_task": (1_000_000 + store_bytes) // stored,
            "store_per_task": store_bytes // stored,
            "kinds": {k: {"count": 1, "bytes": b} for k, b in per_kind.items()}}  # fmt: skip


def test_the_verdict_is_flat_when_memory_follows_the_tasks() -> None:
    # the harness's records grow (they are left out); the store's bytes follow the tasks
    samples = [_sample(t, 400 + (t % 40), {"t": 2000 * (400 + t % 40)}, harness=100 * t)
               for t in range(0, 601, 20)]  # fmt: skip
    found = summarize(samples, 600)
    assert found["verdict"] == "flat"
    assert found["second_half_samples"] == 16
    assert found["grew"] == {}


def test_the_verdict_names_what_grew() -> None:
    samples = [_sample(t, 400, {"t": 800_000, "h": 1000 * t}) for t in range(0, 601, 20)]
    found = summarize(samples, 600)
    assert found["verdict"] == found["verdict_live"] == "not flat"
    assert found["store_per_task_trend"]["per_minute"] > 0
    assert set(found["grew"]) == {"h"}
    assert found["grew"]["h"]["bytes_now"] == 600_000
    assert grew(samples[:1]) == {}  # one sample: nothing to compare
    assert summarize(samples[:2], 600)["verdict"] is None  # too few to fit a line


def test_tombstones_and_commands_are_measured_apart() -> None:
    # what grows by design (feed tombstones, command hashes) fails the overall verdict only
    samples = [_sample(t, 400, {"t": 800_000, "fc": 500 * t, "c": 20 * t}, tombstones=10 * t)
               for t in range(0, 601, 20)]  # fmt: skip
    found = summarize(samples, 600)
    assert (found["verdict"], found["verdict_live"]) == ("not flat", "flat")
    assert set(found["grew"]) == {"fc"}
    assert found["forever"]["bytes_per_tombstone"] == 50
    assert found["forever"]["kinds"]["c"]["bytes"] == 12_000


@pytest.mark.slow
def test_a_one_minute_soak_removes_tasks_while_it_runs(tmp_path: Path) -> None:
    require_redis_server()
    env = dict(os.environ)
    env.pop(UNSAFE_ENV, None)
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "chongming_redis.stress", "--soak", "1", "--soak-rate", "2",
         "--workers", "2", "--seed", "5", "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    bad = {k: report[k] for k in ("violations", "faults_missing", "violation_examples")}
    assert report["ok"] and proc.returncode == 0, bad
    soak = report["soak"]
    assert soak["plan"]["minutes"] == 1 and soak["plan"]["retention"] == 10.0
    assert soak["verdict"] in ("flat", "not flat") and "10%" in soak["rule"]
    assert set(soak["per_task_trend"]) == {"per_minute", "mean", "change"}
    samples = soak["samples"]
    assert len(samples) >= 8
    for sample in samples:
        assert {"t", "used_memory", "stored", "per_task", "store_per_task", "kinds",
                "tombstones", "driver_rss", "watch_tasks"} <= set(sample)  # fmt: skip
    last = samples[-1]
    assert {"t", "h", "fc", "stress:runs"} <= set(last["kinds"])
    # removed while it ran: tombstones during the load, and fewer stored than were created
    assert last["tombstones"] > 0 and report["removed"] > 0
    assert last["stored"] < last["watch_tasks"]  # the watch saw more than is left
    # faults of every kind that applies, through the whole window (not only its first 65%)
    assert set(report["faults_scheduled"]) == set(KINDS) - set(report["faults_skipped"])
    assert any(f["at"] > 0.7 * 60 for f in report["fault_log"] if f["fired"])
