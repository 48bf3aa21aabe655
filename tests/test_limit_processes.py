"""Limits through real ``chongming-redis worker`` processes, as a new user runs them (issue 26):
three workers, a ``Concurrency(2, per="customer")`` type, tasks of four customers. Each task
records the interval its function ran on the machine's clock (one clock for every process
here, and the server's: the servers run on this machine too); a function runs inside the
interval its task holds the slot (the start is written before it begins, the end after it
returns), so no more than 2 intervals of one customer may ever overlap, while the customers
run beside each other.

Every check counts and orders intervals; none times a run against a budget.
"""

from __future__ import annotations

from typing import Any

from chongming_redis.client.client import Client
from chongming_redis.model import TaskStatus
from tests import test_start_path
from tests.test_start_path import Workers, wait_until

# The start-path tests' fixtures: ``target`` (redis, sqlite, postgres), ``workers``, ``client``.
target, workers, client = test_start_path.target, test_start_path.workers, test_start_path.client

APP_SOURCE = """
import time
from chongming_redis import App, Concurrency

app = App("limited")


@app.task("export", limits=[Concurrency(2, per="customer")])
def export(ctx, params):
    began = time.time()
    time.sleep(0.25)
    return [began, time.time()]
"""

CUSTOMERS = ("acme", "zeta", "umbra", "kilo")
PER_CUSTOMER = 8


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of the intervals open at one instant (an end before a start at a
    tie: a slot freed and taken at one instant is not two at once)."""
    events = sorted([(b, 1) for b, _ in intervals] + [(e, -1) for _, e in intervals])
    most = open_now = 0
    for _, step in events:
        open_now += step
        most = max(most, open_now)
    return most


def _finished(client: Client, ids: list[str]) -> bool:
    return all((s := client.get(i)) is not None and s.status.is_terminal for i in ids)


def test_three_workers_never_run_more_than_max_per_key_and_run_keys_side_by_side(
    workers: Workers, client: Client, tmp_path: Any
) -> None:
    (tmp_path / "limitapp.py").write_text(APP_SOURCE, "utf-8")
    for _ in range(3):
        workers.start("limitapp:app", "--concurrency", "4")
    # The first worker records the definition; submits from a producer without the app's code
    # resolve the refs from it (a worker must have recorded the type first).
    wait_until(lambda: bool(client.store.limit_definitions()[1]), "the recorded limits", workers)  # type: ignore[attr-defined]
    ids: dict[str, list[str]] = {c: [] for c in CUSTOMERS}
    for n in range(PER_CUSTOMER):
        for customer in CUSTOMERS:
            handle = client.submit("export", {"customer": customer, "n": n})
            ids[customer].append(handle.task_id)
    every = [i for group in ids.values() for i in group]
    wait_until(lambda: _finished(client, every), "every export", workers, timeout=120)
    spans: dict[str, list[tuple[float, float]]] = {}
    starters: set[str] = set()
    for customer, group in ids.items():
        for task_id in group:
            done = client.get(task_id)
            assert done is not None and done.status is TaskStatus.SUCCEEDED, done
            assert done.limits == (f"export.concurrency={customer}",)
            assert done.attempt == 1  # a task held back spent no attempt
            began, ended = done.result
            spans.setdefault(customer, []).append((began, ended))
            starters.add(test_start_path.starter_of(client, task_id))
    for customer, intervals in spans.items():
        assert _most_at_once(intervals) <= 2, (customer, sorted(intervals))
    everything = [span for intervals in spans.values() for span in intervals]
    assert _most_at_once(everything) > 2, "the customers should have run side by side"
    assert len(starters) >= 2, f"one worker ran everything: {starters}"


def test_most_at_once_counts_overlaps_and_not_touching_ends() -> None:
    assert _most_at_once([]) == 0
    assert _most_at_once([(0, 1), (1, 2), (2, 3)]) == 1
    assert _most_at_once([(0, 2), (1, 3), (1.5, 4)]) == 3
