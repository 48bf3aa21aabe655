"""The CLI's commands that act and report: ``stop``/``pause``/``resume`` wait for the holder
and print the outcome with its latency, ``retry``, ``result`` and ``wait`` — through the real
entry point (``python -m chongming_redis.cli``), against a real Redis and a real worker
process (``chongming-redis worker``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.model import TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.support.store_targets import WITH_CLUSTER, StoreTarget

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[1]
APP = "tests.support.cli_app:app"


def cli(
    *args: str, url: str, namespace: str, cluster: bool = False
) -> subprocess.CompletedProcess[str]:
    """The CLI with the store in the environment: ``CHONGMING_REDIS_URL`` for a Redis URL,
    ``CHONGMING_STORE_URL`` for another store, ``CHONGMING_REDIS_CLUSTER=1`` on a cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    url_env = "CHONGMING_REDIS_URL" if url.startswith(("redis", "unix")) else "CHONGMING_STORE_URL"
    env.update({url_env: url, "CHONGMING_NAMESPACE": namespace})
    if cluster:
        env["CHONGMING_REDIS_CLUSTER"] = "1"
    return subprocess.run([sys.executable, "-m", "chongming_redis.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def one_error_line(result: subprocess.CompletedProcess[str], status: int, *fragments: str) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def store(target: StoreTarget) -> Iterator[Any]:
    made = target.open()
    yield made
    made.close()


@pytest.fixture
def worker(target: StoreTarget, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real worker process (the CLI's own), stopped with SIGTERM afterwards."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    with open(tmp_path / "worker.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "chongming_redis.cli", "worker", APP, *target.cli_args(),
             "--concurrency=4"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        yield process
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def submit(
    name: str, params: dict[str, Any], url: str, namespace: str, cluster: bool = False
) -> str:
    out = ok(cli("submit", APP, name, f"--params={json.dumps(params)}", url=url,
                 namespace=namespace, cluster=cluster))  # fmt: skip
    return out.split()[-1]


def wait_status(store: Any, task_id: str, status: TaskStatus) -> None:
    deadline = time.monotonic() + 20
    while (snapshot := store.get(task_id)) is None or snapshot.status is not status:
        assert time.monotonic() < deadline, f"{task_id} never became {status}"
        time.sleep(0.02)


LINE = re.compile(r"^(stop|pause|resume) of task (\S+): (\S+)(?: \(.*\))? after (\d+) ms$")


def outcome_line(out: str) -> tuple[str, str, str, int]:
    match = LINE.match(out.strip())
    assert match is not None, out
    action, task_id, outcome, ms = match.groups()
    return action, task_id, outcome, int(ms)


@pytest.mark.parametrize("target", WITH_CLUSTER, indirect=True)
def test_stop_pause_resume_of_a_task_a_worker_process_runs_print_outcome_and_latency(
    target: StoreTarget, store: Any, worker: Any
) -> None:
    """On every store: the worker and the commands are given its URL (``--store``, or
    ``CHONGMING_STORE_URL``), and the commands reach the worker's process without nudges; on
    Redis Cluster (``--redis URL --cluster``, or ``CHONGMING_REDIS_CLUSTER=1``) too."""
    url, namespace, cluster = target.url, target.namespace, target.kind == "cluster"
    on = {"url": url, "namespace": namespace, "cluster": cluster}
    task_id = submit("spin", {"seconds": 60}, url, namespace, cluster)
    wait_status(store, task_id, TaskStatus.RUNNING)
    assert outcome_line(ok(cli("pause", task_id, **on)))[:3] == (
        "pause", task_id, "paused")  # fmt: skip
    assert store.get(task_id).status is TaskStatus.PAUSED  # type: ignore[union-attr]
    again = ok(cli("pause", task_id, **on))
    assert outcome_line(again)[2] == "already-paused" and "was already paused" in again
    assert outcome_line(ok(cli("resume", task_id, **on)))[2] == "resumed"
    action, shown_id, outcome, ms = outcome_line(ok(cli("stop", task_id, **on)))  # fmt: skip
    assert (action, shown_id, outcome) == ("stop", task_id, "stopped") and ms < 30_000
    assert store.get(task_id).status is TaskStatus.STOPPED  # type: ignore[union-attr]
    finished = ok(cli("stop", task_id, **on))
    assert outcome_line(finished)[2] == "already-terminal" and "had already finished" in finished
    document = json.loads(ok(cli("stop", task_id, "--json", **on)))
    assert document["outcome"] == "already-terminal" and document["task_id"] == task_id
    assert isinstance(document["latency_ms"], float)


def test_no_wait_sends_and_returns_and_the_worker_applies_it(
    redis_proc: RedisProc, namespace: str, store: RedisTaskStore, worker: Any
) -> None:
    url = redis_proc.url
    task_id = submit("spin", {"seconds": 60}, url, namespace)
    wait_status(store, task_id, TaskStatus.RUNNING)
    out = ok(cli("stop", task_id, "--no-wait", url=url, namespace=namespace))
    assert re.match(rf"^stop of task {task_id}: sent \(command cmd-[0-9a-f]+\); not waiting$",
                    out.strip()), out  # fmt: skip
    wait_status(store, task_id, TaskStatus.STOPPED)


def test_unknown_task_is_one_error_line_and_a_pending_task_changes_without_a_worker(
    redis_proc: RedisProc, namespace: str, store: RedisTaskStore
) -> None:
    url = redis_proc.url
    one_error_line(cli("stop", "no-such-id", url=url, namespace=namespace), 1,
                   "no task 'no-such-id'", namespace)  # fmt: skip
    task_id = submit("echo", {"x": 1}, url, namespace)
    assert outcome_line(ok(cli("pause", task_id, url=url, namespace=namespace)))[2] == "paused"
    assert outcome_line(ok(cli("stop", task_id, url=url, namespace=namespace)))[2] == "stopped"
    assert store.get(task_id).status is TaskStatus.STOPPED  # type: ignore[union-attr]


def test_a_command_nobody_answers_times_out_with_exit_4(
    redis_proc: RedisProc, namespace: str, store: RedisTaskStore
) -> None:
    """A task whose holder is gone while its lease is valid: no answer within --timeout."""
    url = redis_proc.url
    task_id = submit("echo", {"x": 1}, url, namespace)
    pending = store.get(task_id)
    assert pending is not None
    now = store.server_time()
    store.save(pending.evolve(status=TaskStatus.RUNNING, status_version=2, updated_at=now),
               expect_version=1)  # fmt: skip
    store.touch(task_id, lease_owner="gone", lease_until=now.replace(year=now.year + 1))
    line = one_error_line(cli("stop", task_id, "--timeout=0.3", url=url, namespace=namespace), 4,
                          "no answer after", "stays queued")  # fmt: skip
    assert task_id in line


def test_wait_result_and_retry_report_outcomes_with_exit_statuses(
    redis_proc: RedisProc, namespace: str, store: RedisTaskStore, worker: Any
) -> None:
    url = redis_proc.url
    good = submit("echo", {"x": 7}, url, namespace)
    bad = submit("fail", {"message": "bad width"}, url, namespace)
    waited = cli("wait", good, bad, "--timeout=30", url=url, namespace=namespace)
    assert waited.returncode == 3, waited
    lines = waited.stdout.strip().splitlines()
    assert lines[0] == f'{good} succeeded {{"echo": {{"x": 7}}}}'
    assert lines[1].startswith(f"{bad} failed: ") and "ValueError: bad width" in lines[1]
    assert json.loads(ok(cli("result", good, url=url, namespace=namespace))) == {
        "task_id": good, "status": "succeeded", "result": {"echo": {"x": 7}}}  # fmt: skip
    failed = cli("result", bad, url=url, namespace=namespace)
    assert failed.returncode == 3
    document = json.loads(failed.stdout)
    assert document["status"] == "failed" and document["failure"]["error_type"] == "ValueError"
    retried = ok(cli("retry", bad, url=url, namespace=namespace))
    assert retried.strip() == f"task {bad}: retried, attempt 2 is pending"
    as_json = cli("wait", bad, "--json", "--timeout=30", url=url, namespace=namespace)
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["status"] == "failed"
    assert store.get(bad).attempt == 2  # type: ignore[union-attr]
    one_error_line(cli("retry", good, url=url, namespace=namespace), 1, "succeeded",
                   "can be retried")  # fmt: skip
    one_error_line(cli("retry", "nope", url=url, namespace=namespace), 1, "no task 'nope'")
    one_error_line(cli("wait", "nope", url=url, namespace=namespace), 1, "no task 'nope'")


def test_wait_for_a_task_still_running_exits_4_and_result_does_not_wait(
    redis_proc: RedisProc, namespace: str, store: RedisTaskStore
) -> None:
    url = redis_proc.url
    task_id = submit("echo", {"x": 1}, url, namespace)  # no worker: stays pending
    waited = cli("wait", task_id, "--timeout=0.2", url=url, namespace=namespace)
    assert waited.returncode == 4 and waited.stdout.strip().startswith(f"{task_id} pending:")
    result = cli("result", task_id, url=url, namespace=namespace)
    assert result.returncode == 4 and json.loads(result.stdout)["status"] == "pending"


def test_wait_refuses_an_unknown_id_before_waiting_for_the_others(
    redis_proc: RedisProc, namespace: str
) -> None:
    url = redis_proc.url
    task_id = submit("echo", {"x": 1}, url, namespace)  # no worker: it would wait forever
    result = cli("wait", task_id, "nope", url=url, namespace=namespace)
    one_error_line(result, 1, "no task 'nope'")
    assert result.stdout == ""


def test_apps_that_cannot_run_are_one_error_line(
    redis_proc: RedisProc, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "empty_app.py").write_text("from chongming_redis import App\napp = App('e')\n")
    (tmp_path / "raising_app.py").write_text("raise RuntimeError('config missing')\n")
    (tmp_path / "bare_app.py").write_text(
        "from chongming_redis import App\napp = App('b')\n\n@app.task\n"
        "def job(ctx, params):\n    return params\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    env.update(CHONGMING_REDIS_URL=redis_proc.url, CHONGMING_NAMESPACE=namespace,
               PYTHONPATH=str(ROOT))  # fmt: skip

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "chongming_redis.cli", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, env=env)  # fmt: skip

    for command in (("worker", "empty_app:app"), ("submit", "empty_app:app", "job")):
        one_error_line(run(*command), 1, "has no tasks registered", "@app.task")
    one_error_line(run("submit", "raising_app:app", "job"), 1,
                   "importing 'raising_app' failed: RuntimeError: config missing")  # fmt: skip
    assert len(ok(run("submit", "bare_app:app", "job")).split()) == 1  # @app.task, bare


def test_reconcile_retries_as_the_workers_flags_say(
    redis_proc: RedisProc, namespace: str, store: RedisTaskStore
) -> None:
    url = redis_proc.url

    def expired_running() -> str:
        task_id = submit("echo", {"x": 1}, url, namespace)
        pending = store.get(task_id)
        assert pending is not None
        now = store.server_time()
        store.save(pending.evolve(status=TaskStatus.RUNNING, status_version=2, updated_at=now),
                   expect_version=1)  # fmt: skip
        store.touch(task_id, lease_owner="gone", lease_until=now.replace(year=now.year - 1))
        return task_id

    once = expired_running()
    report = json.loads(ok(cli("reconcile", "--max-attempts=1", "--json", url=url,
                               namespace=namespace)))  # fmt: skip
    assert (report["lost"], report["retried"]) == ([once], [])
    assert store.get(once).status is TaskStatus.LOST  # type: ignore[union-attr]
    again = expired_running()
    report = json.loads(ok(cli("reconcile", "--json", url=url, namespace=namespace)))
    assert (report["lost"], report["retried"]) == ([again], [again])
    retried = store.get(again)
    assert retried is not None and (retried.status, retried.attempt) == (TaskStatus.PENDING, 2)
    one_error_line(cli("reconcile", "--max-attempts=0", url=url, namespace=namespace), 1,
                   "--max-attempts must be at least 1")  # fmt: skip
