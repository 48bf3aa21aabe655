"""A smoke run of the sharding prototype (``bench/scale_out.py``) at a tiny size, and of the
model it calibrates (``bench/scale_out_sim.py``): they run, print every row, and the
prototype's own checks (exactly-once, the merged walk, the global feed) say yes. No timing
is asserted (the figures are the benchmark's to print, on a noisy machine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from bench.scale_out_client import shard_buckets, split
from bench.scale_out_feed import item_id
from bench.scale_out_sim import (
    Calibration,
    shard_shares,
    throughput,
    worker_rate,
    workers_per_shard,
)
from tests.support.fixtures import require_redis_server

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, timeout: float = 180) -> str:
    result = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def rows(output: str, first: str) -> list[list[str]]:
    """The body rows of the rich tables whose first cell matches ``first``."""
    found = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) >= 2 and re.fullmatch(first, cells[0]):
            found.append(cells)
    return found


def test_the_prototype_prints_a_row_per_master_and_its_checks_pass(tmp_path: Path) -> None:
    require_redis_server()
    calib = tmp_path / "calib.json"
    out = run("-m", "bench.scale_out", "--tasks", "120", "--masters", "1,2", "--read-repeats",
              "3", "--json", str(calib))  # fmt: skip
    per_master = [r for r in rows(out, r"[12]") if re.fullmatch(r"\d/\d", r[1])]
    assert [r[1] for r in per_master] == ["1/1", "1/2", "2/2"]
    # each master's tasks add up to the round's, and every round is exactly-once
    assert sum(int(r[3]) for r in per_master[1:]) == int(per_master[0][3]) == 120
    rounds = [r for r in rows(out, r"[12]") if r[1] == "120"]
    assert [r[0] for r in rounds] == ["1", "2"] and all(r[-1] == "yes" for r in rounds)
    reads = [r for r in rows(out, r"[12]") if r[-1] in ("yes", "NO") and "/" in r[-2]]
    assert [r[-1] for r in reads] == ["yes", "yes"]
    feed = rows(out, r"global feed read from 0.*")
    assert feed and feed[0][1] == "120 / 120 / 120 / 120"
    figures = json.loads(calib.read_text())
    assert set(figures["redis_us_per_task"]) == {"1", "2"}
    sim = run("-m", "bench.scale_out_sim", "--calibration", str(calib), "--masters", "3")
    assert len(rows(sim, r"[123]")) == 6  # two tables of three rows


def test_the_model_prints_masters_by_workers() -> None:
    out = run("-m", "bench.scale_out_sim")
    table = rows(out, r"[1-8]")
    assert len(table) == 16 and all(len(r) == 8 for r in table)
    assert all(re.fullmatch(r"[\d,.]+ [WRF]", cell) for r in table for cell in r[1:])


def test_the_model_binds_where_it_should() -> None:
    c = Calibration()
    assert throughput(c, 8, 1, feed=False) == (worker_rate(c), "W")  # masters idle
    assert throughput(c, 1, 64, feed=False)[1] == "R"
    assert throughput(c, 8, 64, feed=True)[1] == "R"  # the global feed's master has room
    assert throughput(replace(c, feed_us=40.0), 8, 64, feed=True)[1] == "F"
    rates = [throughput(c, s, 64, feed=False)[0] for s in range(1, 9)]
    assert rates == sorted(rates)  # more masters never carry less
    assert workers_per_shard(4, shard_shares(64, 3)) == [2.0, 1.0, 1.0]
    assert sum(workers_per_shard(2, shard_shares(64, 3))) == 2


def test_the_shard_map_and_the_feed_item_ids() -> None:
    shards = shard_buckets(64, 3)
    assert sorted(b for s in shards for b in s) == list(range(64))
    assert [len(s) for s in shards] == [22, 21, 21] and shards[1][:2] == (1, 4)
    assert split((1, 4, 7, 10, 13), 2) == [(1, 7, 13), (4, 10)]
    assert item_id(b"tabc") == "abc"
    assert item_id(b"r1700000000000000 5 7 a b:c d" + b"x y") == "x y"
