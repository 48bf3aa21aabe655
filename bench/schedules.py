"""What stored schedules cost a drain when none is due, measured in one run (Redis, AOF off,
and SQLite).

    .venv/bin/python -m bench.schedules                # 4,000 tasks per drain, 3 rounds
    .venv/bin/python -m bench.schedules --quick        # 1,000 tasks, 2 rounds

Each drain is ``bench.limits``'s (N no-op tasks submitted before a ``Controller`` with the
CLI's defaults starts; timed until every task has succeeded; every history checked), in a
namespace with no schedule and in one with ``SCHEDULES`` stored (``every`` a day: none due, so
each worker's firing loop reads them every 0.5 s and fires nothing). Each round runs both, the
one or the other first in turn, so both see the machine at the same moments; the ratio of the
medians is what a schedule costs (target: within noise, >= 0.97). No assertions: it reports,
docs/performance.md records.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.drains import code_under_test, load_average
from bench.limits import app, drain, stores
from chongming_redis.client.client import Client
from chongming_redis.schedules import Schedule

SCHEDULES = 20


def with_schedules(open_run: Callable[[str], Any]) -> Callable[[str], Any]:
    """``open_run`` whose namespace holds ``SCHEDULES`` schedules none of which is due."""

    def opened(run: str) -> Any:
        store = open_run(run)
        client = Client(store, app=app)
        for n in range(SCHEDULES):
            client.schedules.upsert(Schedule(f"daily-{n}", "plain", every=86400))
        return store

    return opened


def compare(open_run: Callable[[str], Any], store: str, n: int, rounds: int) -> list[Any]:
    times: dict[str, list[float]] = {"none": [], "stored": []}
    for r in range(rounds):
        kinds = [("none", open_run), ("stored", with_schedules(open_run))]
        for kind, opener in kinds if r % 2 == 0 else kinds[::-1]:  # each goes first in turn
            whole = drain(opener, f"sc-{store}-{kind}-{r}", "plain", [None] * n)
            times[kind].append(n / whole)
    none, stored = (statistics.median(times[k]) for k in ("none", "stored"))
    pairs = " / ".join(f"{a:,.0f}:{b:,.0f}" for a, b in zip(times["none"], times["stored"]))
    return [store, f"{none:,.0f}", f"{stored:,.0f}", f"{stored / none:.2f}", pairs]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.schedules",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 tasks, 2 rounds")
    parser.add_argument("--stores", default="redis,sqlite")
    options = parser.parse_args(argv)
    n, rounds = (1_000, 2) if options.quick else (options.tasks, options.rounds)
    names = [s.strip() for s in options.stores.split(",") if s.strip()]
    console = Console()
    console.print(f"load average at start: {load_average()}")
    with tempfile.TemporaryDirectory() as tmp, stores(names, Path(tmp)) as opened:
        table = Table(title=f"{n:,} no-op tasks, without and with {SCHEDULES} stored schedules "
                            "none of which is due: tasks/s (medians)")  # fmt: skip
        for column in ("store", "no schedule", f"{SCHEDULES} schedules", "ratio", "rounds"):
            table.add_column(column, justify="right")
        for store, open_run in opened.items():
            table.add_row(*compare(open_run, store, n, rounds))
        console.print(table)
    console.print(f"load average at end: {load_average()}; code under test: {code_under_test()}")


if __name__ == "__main__":
    main()
