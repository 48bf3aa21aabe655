"""``chongming-redis worker --metrics-port``, as real processes on a real redis-server: the
``/metrics`` page scraped and parsed with prometheus-client's own parser.

* a lone worker counts every task run by task type and how it ended, exactly;
* under ``--processes 2`` the parent serves one page, the sum of both children (both ran
  tasks); after a child is killed and restarted nothing went back, and the dead child's gauges
  no longer count;
* a Redis outage shows as store errors, and its end as one reconnect;
* a bad port, a taken port or an address not on this machine: one ``error:`` line, exit 1.

No timing assertion: every wait polls the page (or the store) with a generous timeout.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chongming_redis.model import TaskStatus
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.cli_app import app as cli_app
from tests.support.redis_server import RedisProc, free_port
from tests.test_cli import ROOT, cli, user_error

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]

APP = "tests.support.cli_app:app"
WAIT = 60.0
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

#: Straight to the worker: never through a proxy named in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(port: int) -> Samples | None:
    """Every sample of ``/metrics`` parsed back, ``(name, labels) -> value``; ``None`` while
    nothing listens there yet."""
    try:
        with _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def total(found: Samples, name: str) -> float:
    return sum(v for (n, _), v in found.items() if n == name)


def wait_scrape(port: int, predicate: Callable[[Samples], bool], what: str) -> Samples:
    deadline = time.monotonic() + WAIT
    found: Samples | None = None
    while True:
        found = scrape(port)
        if found is not None and predicate(found):
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {found}"
        time.sleep(0.1)


def wait_until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class WorkerProc:
    """``chongming-redis worker APP ...`` with its stderr in a file (never a full pipe)."""

    def __init__(self, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
        base.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.log = log
        with open(log, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chongming_redis.cli", "worker", APP,
                 "--log-level=WARNING", *args],
                cwd=ROOT, env={**base, **(env or {})}, stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip

    def stop(self) -> int:
        """SIGINT (Ctrl-C), as a person stops it; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(90)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for worker in started:  # a test that failed half-way: its processes, by pid
        if worker.proc.poll() is None:
            for child in psutil.Process(worker.proc.pid).children(recursive=True):
                child.kill()
            worker.proc.kill()
            worker.proc.wait(10)


@pytest.fixture
def client(redis_proc: RedisProc, namespace: str) -> Iterator[Controller]:
    """A pure client of the namespace (submits, stops, reads), on the app's task types."""
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield Controller(store, app=cli_app, owner="metrics-test")
    store.close()


def run_mixed_batch(client: Controller, echoes: int) -> list[str]:
    """``echoes`` × ``echo`` (succeeded), 3 × ``fail`` (failed), 2 × ``spin`` stopped while
    they run; returns every task id once every one of them has ended."""
    spins = client.submit_many("spin", [{"seconds": 60}] * 2)
    store = client.store
    wait_until(lambda: all(store.get(t).status is TaskStatus.RUNNING for t in spins), "spins")
    for task_id in spins:
        client.stop(task_id)
    ids = spins + client.submit_many("echo", list(range(echoes)))
    ids += client.submit_many("fail", [{}] * 3)
    wait_until(lambda: all(store.get(t).status.is_terminal for t in ids), "every task to end")
    return ids


def assert_counts(found: Samples, *, echoes: int, fails: int, spins: int) -> None:
    """The exact counts of runs that all began and ended in the workers behind the page."""
    ended = {("echo", "succeeded"): echoes, ("fail", "failed"): fails, ("spin", "stopped"): spins}
    for task, runs in (("echo", echoes), ("fail", fails), ("spin", spins)):
        assert value(found, "chongming_worker_tasks_started_total", task=task) == runs, task
        for status in ("succeeded", "failed", "stopped", "lost"):
            count = value(found, "chongming_worker_tasks_finished_total", task=task,
                          status=status)  # fmt: skip
            assert count == ended.get((task, status), 0), (task, status)
        assert value(found, "chongming_worker_task_duration_seconds_count", task=task) == runs
        assert value(found, "chongming_worker_task_duration_seconds_sum", task=task) > 0
    assert value(found, "chongming_worker_tasks_running") == 0
    assert total(found, "chongming_worker_store_errors_total") == 0


def finished(found: Samples) -> float:
    return total(found, "chongming_worker_tasks_finished_total")


# -- a lone worker ------------------------------------------------------------------------------


def test_a_lone_worker_counts_every_run_by_task_and_how_it_ended(
    redis_proc: RedisProc, namespace: str, client: Controller, workers: list[WorkerProc],
    tmp_path: Path,
) -> None:  # fmt: skip
    port = free_port()
    worker = WorkerProc(tmp_path / "worker.log", f"--redis={redis_proc.url}",
                        f"--namespace={namespace}", f"--metrics-port={port}")  # fmt: skip
    workers.append(worker)
    found = wait_scrape(port, lambda f: value(f, "chongming_worker_buckets_owned") == 64,
                        "the worker to own every bucket")  # fmt: skip
    # Every series is there from the start, at 0.
    assert finished(found) == 0
    lost = frozenset({("task", "echo"), ("status", "lost")})
    assert found[("chongming_worker_tasks_finished_total", lost)] == 0
    run_mixed_batch(client, echoes=5)
    found = wait_scrape(port, lambda f: finished(f) == 10, "ten runs to be counted")
    assert_counts(found, echoes=5, fails=3, spins=2)
    assert value(found, "process_cpu_seconds_total") > 0  # the lone worker's own process
    assert worker.stop() == 0, worker.output()


# -- --processes 2 ------------------------------------------------------------------------------


def starters(store: RedisTaskStore, task_ids: list[str]) -> set[str]:
    """The workers that started these tasks (their histories' ``started by <owner>``)."""
    found = set()
    for task_id in task_ids:
        for entry in store.history(task_id):
            match = re.match(r"started by (\S+) \(attempt", entry.reason or "")
            if match:
                found.add(match.group(1))
    return found


def owner_of(pid: int) -> str:
    return f"{os.uname().nodename}-{pid}"


def test_a_processes_parent_serves_the_sum_of_its_children_and_a_restart_loses_nothing(
    redis_proc: RedisProc, namespace: str, client: Controller, workers: list[WorkerProc],
    tmp_path: Path,
) -> None:  # fmt: skip
    port, tmp = free_port(), tmp_path / "tmp"
    tmp.mkdir()
    parent = WorkerProc(tmp_path / "parent.log", f"--redis={redis_proc.url}",
                        f"--namespace={namespace}", f"--metrics-port={port}", "--processes=2",
                        "--worker-lease=1", env={"TMPDIR": str(tmp)})  # fmt: skip
    workers.append(parent)
    store = client.store

    def settled(owners: set[str]) -> bool:
        """Both children own half of the buckets each (and no one else owns any)."""
        _, held = store.pool_state()
        counts = [list(held.values()).count(o) for o in owners]
        return len(held) == 64 and set(held.values()) == owners and min(counts) >= 31

    me = psutil.Process(parent.proc.pid)
    wait_until(lambda: len(me.children()) == 2, "two children")
    children = {c.pid for c in me.children()}
    wait_until(lambda: settled({owner_of(p) for p in children}), "the pool to settle")
    wait_scrape(port, lambda f: value(f, "chongming_worker_buckets_owned") == 64, "64 buckets")
    assert [p.name for p in tmp.iterdir()] != []  # the children's files live there

    ids = run_mixed_batch(client, echoes=20)
    found = wait_scrape(port, lambda f: finished(f) == 25, "25 runs to be counted")
    assert_counts(found, echoes=20, fails=3, spins=2)
    assert starters(store, ids) == {owner_of(p) for p in children}  # both ran some

    # A child killed and restarted: its counts stay in the sum, its gauges leave it. (Killed
    # past the parent's start-up window: a death within it means the pool could not start.)
    started = max(c.create_time() for c in me.children())
    wait_until(lambda: time.time() - started > 4, "the end of the start-up window")
    victim = min(children)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len([c for c in me.children() if c.pid not in children]) == 1
               and len(me.children()) == 2, "the restarted child")  # fmt: skip
    now = {c.pid for c in me.children()}
    found = scrape(port)
    assert found is not None and finished(found) == 25  # nothing went back
    wait_until(lambda: settled({owner_of(p) for p in now}), "the pool to settle again")
    wait_scrape(port, lambda f: value(f, "chongming_worker_buckets_owned") == 64,
                "64 buckets over the live children only")  # fmt: skip
    ids = run_mixed_batch(client, echoes=6)
    found = wait_scrape(port, lambda f: finished(f) == 36, "36 runs to be counted")
    assert_counts(found, echoes=26, fails=6, spins=4)
    assert parent.stop() == 0, parent.output()
    assert list(tmp.glob("chongming-metrics-*")) == []  # the shared directory is gone


# -- a Redis outage -----------------------------------------------------------------------------


def test_an_outage_counts_store_errors_and_its_end_one_reconnect(
    fresh_redis_proc: RedisProc, namespace: str, workers: list[WorkerProc], tmp_path: Path
) -> None:
    port = free_port()
    worker = WorkerProc(tmp_path / "worker.log", f"--redis={fresh_redis_proc.url}",
                        f"--namespace={namespace}", f"--metrics-port={port}",
                        "--worker-lease=1", "--task-lease=2")  # fmt: skip
    workers.append(worker)
    wait_scrape(port, lambda f: value(f, "chongming_worker_buckets_owned") == 64, "64 buckets")
    fresh_redis_proc.stop()
    found = wait_scrape(port, lambda f: value(f, "chongming_worker_store_errors_total",
                                              operation="pool") >= 1,
                        "a failed pool heartbeat")  # fmt: skip
    assert value(found, "chongming_worker_reconnects_total") == 0
    fresh_redis_proc.restart()
    found = wait_scrape(port, lambda f: value(f, "chongming_worker_reconnects_total") >= 1,
                        "the reconnect")  # fmt: skip
    assert value(found, "chongming_worker_reconnects_total") == 1
    assert worker.stop() == 0, worker.output()


# -- refused ports ------------------------------------------------------------------------------


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_one_line(redis_proc: RedisProc, port: str) -> None:
    result = cli("worker", APP, f"--redis={redis_proc.url}", f"--metrics-port={port}")
    user_error(result, "--metrics-port must be a TCP port", port)


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_taken_port_is_one_line_and_nothing_starts(
    redis_proc: RedisProc, namespace: str, processes: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("worker", APP, f"--redis={redis_proc.url}", f"--namespace={namespace}",
                     f"--metrics-port={port}", f"--processes={processes}",
                     env={"TMPDIR": str(tmp_path)})  # fmt: skip
    user_error(result, f"cannot serve metrics on 127.0.0.1:{port}", "in use")
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    assert store.pool_state() == ({}, {})  # no worker ever joined
    assert list(tmp_path.iterdir()) == []  # nor was a shared directory left behind


def test_an_address_not_on_this_machine_is_one_line(redis_proc: RedisProc) -> None:
    port = str(free_port())
    # 192.0.2.1 is TEST-NET-1: never an address of this machine (and nothing is sent to it).
    result = cli("worker", APP, f"--redis={redis_proc.url}", f"--metrics-port={port}",
                 "--metrics-host=192.0.2.1")  # fmt: skip
    user_error(result, f"cannot serve metrics on 192.0.2.1:{port}")
