"""What the drain benchmarks share (``bench.throughput`` on Redis, ``bench.store_throughput`` on
every built-in store): the exactly-once check of the drained tasks' histories, percentiles,
and the run's context (load average, the commit under test)."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chongming_redis.model import TaskStatus, Transition


@dataclass
class Check:
    """What the histories say."""

    checked: int = 0
    bad: list[str] = field(default_factory=list)
    started_by: Counter[str] = field(default_factory=Counter)
    starts: int = 0

    @property
    def exactly_once(self) -> bool:
        return self.checked > 0 and not self.bad

    def verdict(self) -> str:
        return "yes" if self.exactly_once else f"NO ({len(self.bad)} bad)"


def check_entries(found: Mapping[str, Sequence[Transition]], task_ids: Sequence[str]) -> Check:
    """Exactly-once starts: per task, versions 1..k without gaps, one ``PENDING -> RUNNING``
    per attempt (attempts = 1 + hand-backs/retries to PENDING), final entry SUCCEEDED."""
    check = Check()
    for task_id in task_ids:
        entries = found[task_id]
        check.checked += 1
        versions = [e.version for e in entries]
        starts = [e for e in entries if e.to_status is TaskStatus.RUNNING
                  and e.from_status is TaskStatus.PENDING]  # fmt: skip
        attempts = 1 + sum(
            1 for e in entries if e.to_status is TaskStatus.PENDING and e.from_status is not None
        )
        check.starts += len(starts)
        for entry in starts:
            reason = entry.reason or ""
            check.started_by[reason.split("started by ", 1)[-1].split(" ", 1)[0]] += 1
        problem = None
        if versions != list(range(1, len(versions) + 1)):
            problem = f"versions {versions}"
        elif len(starts) != attempts:
            problem = f"{len(starts)} starts for {attempts} attempt(s)"
        elif attempts != 1:
            problem = f"{attempts} attempts"
        elif not entries or entries[-1].to_status is not TaskStatus.SUCCEEDED:
            problem = f"ends {entries[-1].to_status if entries else 'empty'}"
        if problem is not None:
            check.bad.append(f"{task_id}: {problem}")
    return check


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def load_average() -> str:
    """Other processes on the box skew every rate here (the CPU per task much less)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def code_under_test() -> str:
    """The commit of the checkout the workers import, and whether the package is modified."""
    import chongming_redis

    package = Path(chongming_redis.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=package,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", str(package), str(package.parent / "lua")],
            cwd=package,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return f"{package} (not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"{commit}" + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")
