"""The CLI and limits: ``chongming-redis limits`` (text and ``--json``), a worker refusing a
conflicting definition with one line and exit 1, ``--replace-limits``, and the one-line error
of a store without ``LimitsStore``.

Run in-process (typer's test runner) on ``InMemoryTaskStore``, the limits' reference, put in
place of the store the URL would open: the commands' own code runs, from the options to the
exit status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from chongming_redis import Concurrency, InMemoryTaskStore
from chongming_redis.cli import read
from chongming_redis.cli import worker as worker_cli
from chongming_redis.cli.root import app as cli_app
from chongming_redis.limits import to_json
from chongming_redis.runtime.controller import Controller
from tests.support.flaky_store import ProtocolOnlyStore
from tests.support.limits_app import app as limits_app
from tests.support.limits_app import fill

APP = "tests.support.limits_app:app"
STORE = ["--store", "sqlite:///nowhere/limits.db"]  # parsed, never opened (open_store is ours)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryTaskStore]:
    s = InMemoryTaskStore()
    monkeypatch.setattr(read, "open_store", lambda *a, **k: s)
    monkeypatch.setattr(worker_cli, "open_store", lambda *a, **k: s)
    monkeypatch.setattr(worker_cli, "configure_logging", lambda level: None)
    monkeypatch.setattr(worker_cli, "say_ctrl_c_once_handled", lambda: None)
    yield s
    s.close()


def run(*args: str) -> Any:
    return CliRunner().invoke(cli_app, list(args), env={"COLUMNS": "200"})


def one_error_line(result: Any, *fragments: str) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.output
    return str(lines[0])


def test_limits_prints_each_limit_with_held_waiting_and_its_busiest_keys(
    store: InMemoryTaskStore,
) -> None:
    fill(store)
    result = run("limits", *STORE)
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.replace("│", " ").split()) for line in result.stdout.splitlines()]
    assert "export.concurrency concurrency 2 per customer export 3 1" in lines
    assert "acme 2 1" in lines and "zeta 1 0" in lines
    # A rate limit's held is what the store reports (the reference counts its running tasks).
    assert any(line.startswith("payments rate 100/1s burst 100 charge, export ") for line in lines)


def test_limits_json_has_the_documented_keys(store: InMemoryTaskStore) -> None:
    fill(store)
    result = run("limits", "--json", "--busiest", "1", *STORE)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    by_id = {one["id"]: one for one in doc["limits"]}
    assert doc["namespace"] == "default" and set(by_id) == {"export.concurrency", "payments"}
    conc = by_id["export.concurrency"]
    assert conc["definition"] == {"kind": "concurrency", "max": 2, "per": "customer"}
    assert conc["task_types"] == ["export"]
    assert (conc["held"], conc["waiting"], conc["refs"]) == (3, 1, 2)
    assert conc["busiest"] == [{"ref": "export.concurrency=acme", "key": "acme", "held": 2,
                                "waiting": 1}]  # fmt: skip
    assert by_id["payments"]["task_types"] == ["charge", "export"]
    assert by_id["payments"]["definition"]["kind"] == "rate"


def test_show_names_a_tasks_refs(store: InMemoryTaskStore) -> None:
    ids = fill(store)
    result = run("show", ids["zeta"][0], *STORE)
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert "limits export.concurrency=zeta, payments" in lines


def test_limits_on_a_namespace_without_limits_says_so(store: InMemoryTaskStore) -> None:
    result = run("limits", *STORE)
    assert result.exit_code == 0 and "has no limits recorded" in result.stdout
    assert json.loads(run("limits", "--json", *STORE).stdout)["limits"] == []


def test_limits_on_a_store_without_limits_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = ProtocolOnlyStore(InMemoryTaskStore(), failing=())
    monkeypatch.setattr(read, "open_store", lambda *a, **k: bare)
    one_error_line(run("limits", *STORE), "does not record limits", "LimitsStore")


def test_a_worker_with_a_conflicting_definition_exits_1_with_one_line(
    store: InMemoryTaskStore,
) -> None:
    other = to_json(Concurrency(9, per="customer"))
    store.record_limits({"export.concurrency": other}, {"export": ("export.concurrency",)})
    line = one_error_line(run("worker", APP, *STORE), "export.concurrency", "--replace-limits")
    assert other in line
    assert store.limit_definitions()[0]["export.concurrency"] == other  # nothing replaced


def test_a_worker_with_replace_limits_records_its_definitions(
    store: InMemoryTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[bool] = []
    monkeypatch.setattr(Controller, "join_pool", lambda self, worker_lease: None)
    monkeypatch.setattr(Controller, "run_forever",
                        lambda self, grace, **signals: ran.append(True))  # fmt: skip
    store.record_limits({"export.concurrency": to_json(Concurrency(9, per="customer"))},
                        {"export": ("export.concurrency",)})  # fmt: skip
    result = run("worker", APP, *STORE, "--replace-limits")
    assert result.exit_code == 0, result.output
    assert ran == [True]
    assert store.limit_definitions() == limits_app.limit_definitions()


def test_a_worker_whose_store_would_not_enforce_limits_exits_1_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bare = ProtocolOnlyStore(InMemoryTaskStore(), failing=())
    monkeypatch.setattr(worker_cli, "open_store", lambda *a, **k: bare)
    monkeypatch.setattr(worker_cli, "configure_logging", lambda level: None)
    monkeypatch.setattr(worker_cli, "say_ctrl_c_once_handled", lambda: None)
    one_error_line(run("worker", APP, *STORE), "does not enforce limits", "would not hold")


# -- real processes on a SQLite file (once its store enforces limits) ---------------------------


def sqlite_limits_store(path: Any) -> Any:
    from chongming_redis.stores.extensions import LimitsStore
    from chongming_redis.stores.urls import open_store_url

    store = open_store_url(f"sqlite:///{path}", namespace="default")
    if not isinstance(store, LimitsStore):
        store.close()
        pytest.skip("the SQLite store does not enforce limits yet")
    return store


def test_processes_a_conflicting_worker_exits_1_and_replace_limits_starts(tmp_path: Any) -> None:
    import subprocess
    import sys
    import time

    from tests.test_cli import ROOT, cli, ok, user_error

    path = tmp_path / "limits.db"
    url = f"sqlite:///{path}"
    store = sqlite_limits_store(path)
    try:
        other = to_json(Concurrency(9, per="customer"))
        store.record_limits({"export.concurrency": other}, {"export": ("export.concurrency",)})
        line = user_error(cli("worker", APP, "--store", url), "--replace-limits", other)
        assert "export.concurrency" in line
        # Under a --processes parent too: one line (the parent's), not one per child.
        user_error(cli("worker", APP, "--store", url, "--processes", "2"), "--replace-limits")
        assert store.limit_definitions()[0]["export.concurrency"] == other
        proc = subprocess.Popen([sys.executable, "-m", "chongming_redis.cli", "worker", APP,
                                 "--store", url, "--replace-limits", "--log-level", "WARNING"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while store.limit_definitions() != limits_app.limit_definitions():
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the worker never recorded its limits"
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
        doc = json.loads(ok(cli("limits", "--store", url, "--json")))
        assert {one["id"] for one in doc["limits"]} == {"export.concurrency", "payments"}
        conc = next(one for one in doc["limits"] if one["id"] == "export.concurrency")
        assert conc["definition"] == {"kind": "concurrency", "max": 2, "per": "customer"}
    finally:
        store.close()
