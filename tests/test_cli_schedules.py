"""``chongming-redis schedules list|show|upsert|pause|resume|trigger|delete``: through the real
entry point (``python -m chongming_redis.cli``) against a real Redis: the text and ``--json``
outputs, exit statuses, the one ``error:`` line of a mistake and that a refused upsert stored
nothing. A store without schedules runs in-process (no URL opens one)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[1]
TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
SHOWN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
COUNTS_ZERO = {"fired": 0, "skipped": 0, "missed": 0, "triggered": 0}


@pytest.fixture
def store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    made = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield made
    made.close()


@pytest.fixture
def cli(redis_proc: RedisProc, namespace: str) -> Any:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
        env.update({"CHONGMING_REDIS_URL": redis_proc.url, "CHONGMING_NAMESPACE": namespace})
        return subprocess.run([sys.executable, "-m", "chongming_redis.cli", "schedules", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env=env)  # fmt: skip

    return run


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.stderr == "", result.stderr
    return result.stdout


def one_error_line(result: subprocess.CompletedProcess[str], status: int = 1) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def rows(text: str) -> list[str]:
    """Each line of a table, its borders and runs of spaces as one space."""
    return [" ".join(re.sub("[│┃]", " ", line).split()) for line in text.splitlines()]


def stored_state(store: RedisTaskStore, schedule_id: str) -> dict[str, Any]:
    record = store.schedule_record(schedule_id)
    assert record is not None
    return json.loads(record[1])  # type: ignore[no-any-return]


# -- upsert ------------------------------------------------------------------------------------


def test_upsert_creates_then_leaves_alone_then_updates(cli: Any, store: RedisTaskStore) -> None:
    args = ("nightly", "echo", "--cron", "0 3 * * *", "--tz", "Europe/Berlin",
            "--params", '{"kind": "daily"}')  # fmt: skip
    line = ok(cli("upsert", *args)).strip()
    assert re.fullmatch(rf"schedule nightly created \(version 1\): task echo cron 0 3 \* \* \* "
                        rf"\(Europe/Berlin\), next tick {SHOWN}", line), line  # fmt: skip
    assert ok(cli("upsert", *args)).startswith("schedule nightly unchanged (version 1): ")
    changed = ok(cli("upsert", *args[:-1], '{"kind": "weekly"}'))
    assert changed.startswith("schedule nightly updated (version 2): ")
    state = stored_state(store, "nightly")
    assert state["schedule"] == {"id": "nightly", "task": "echo", "params": {"kind": "weekly"},
                                 "cron": "0 3 * * *", "every": None, "tz": "Europe/Berlin",
                                 "overlap": "skip"}  # fmt: skip


def test_upsert_json_is_the_stored_schedule(
    cli: Any, store: RedisTaskStore, namespace: str
) -> None:
    doc = json.loads(ok(cli("upsert", "fast", "echo", "--every", "60", "--overlap", "buffer_one",
                            "--json")))  # fmt: skip
    assert set(doc) == {"namespace", "outcome", "schedule"}
    assert (doc["namespace"], doc["outcome"]) == (namespace, "created")
    schedule = doc["schedule"]
    assert set(schedule) == {"id", "version", "definition", "paused", "next_tick", "updated_at",
                             "last_task", "buffered", "counts", "recent"}  # fmt: skip
    assert schedule["definition"] == {"id": "fast", "task": "echo", "params": None,
                                      "cron": None, "every": 60, "tz": "UTC",
                                      "overlap": "buffer_one"}  # fmt: skip
    assert (schedule["id"], schedule["version"], schedule["paused"]) == ("fast", 1, False)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:00\.000000Z", schedule["next_tick"])
    assert re.fullmatch(TIME, schedule["updated_at"])
    assert (schedule["last_task"], schedule["buffered"], schedule["recent"]) == (None, None, [])
    assert schedule["counts"] == COUNTS_ZERO
    assert stored_state(store, "fast")["schedule"]["overlap"] == "buffer_one"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--cron", "99 * * * *"), "Schedule.cron '99 * * * *': Bad minute"),
        (("--cron", "bad"), "Schedule.cron must have five fields"),
        (("--cron", "30 2 30 2 *"), "Schedule.cron '30 2 30 2 *': Bad day-of-month"),
        (("--every", "5", "--tz", "Mars/Base"), "Schedule.tz: unknown time zone 'Mars/Base'"),
        ((), "give exactly one of --cron EXPR and --every SECONDS"),
        (("--every", "5", "--cron", "* * * * *"), "give exactly one of --cron EXPR and --every"),
        (("--every", "0"), "Schedule.every must be a whole number of seconds >= 1, not 0"),
        (("--every", "1.5"), "Schedule.every must be a whole number of seconds >= 1, not 1.5"),
        (("--every", "5", "--params", "{"), "--params is not JSON: "),
        (("--every", "5", "--overlap", "never"), "Invalid value for '--overlap'"),
    ],
)
def test_a_bad_definition_is_one_error_line_and_stores_nothing(
    cli: Any, store: RedisTaskStore, args: tuple[str, ...], fragment: str
) -> None:
    line = one_error_line(cli("upsert", "refused", "echo", *args))
    assert fragment in line, line
    assert store.schedule_records() == {}


def test_a_bad_id_is_refused(cli: Any, store: RedisTaskStore) -> None:
    line = one_error_line(cli("upsert", "a@b", "echo", "--every", "5"))
    assert line == "error: Schedule.id may not contain '@' (it separates the id from the tick)"
    assert store.schedule_records() == {}


def test_a_task_no_worker_runs_is_refused_once_the_workers_recorded_names(
    cli: Any, store: RedisTaskStore
) -> None:
    store.record_task_types(["echo", "spin"])
    line = one_error_line(cli("upsert", "typo", "ehco", "--every", "5"))
    assert line.startswith("error: unknown task type 'ehco' (the namespace's workers run: "
                           "echo, spin)")  # fmt: skip
    assert store.schedule_records() == {}
    ok(cli("upsert", "right", "echo", "--every", "5"))
    assert set(store.schedule_records()) == {"right"}


# -- list / show -------------------------------------------------------------------------------


def test_list_says_when_there_are_none(cli: Any, namespace: str, redis_proc: RedisProc) -> None:
    assert ok(cli("list")) == f"namespace {namespace!r} on {redis_proc.url} has no schedules\n"
    assert json.loads(ok(cli("list", "--json"))) == {"namespace": namespace, "schedules": []}


def test_list_has_a_row_per_schedule(cli: Any, namespace: str) -> None:
    ok(cli("upsert", "b-every", "echo", "--every", "3600"))
    ok(cli("upsert", "a-cron", "spin", "--cron", "15 4 * * 1", "--tz", "Asia/Tokyo"))
    ok(cli("pause", "a-cron"))
    task_id = ok(cli("trigger", "b-every")).strip()
    lines = rows(ok(cli("list")))
    assert lines[0] == "2 schedule(s)"
    assert "id task timing paused next tick fired skipped missed triggered last task" in lines
    (cron_row,) = [line for line in lines if line.startswith("a-cron ")]
    assert cron_row == "a-cron spin cron 15 4 * * 1 (Asia/Tokyo) yes – 0 0 0 0 –"
    (every_row,) = [line for line in lines if line.startswith("b-every ")]
    relative = r"\((in [^)]+|[^)]+ ago)\)"  # "ago" if the hour turned meanwhile
    pattern = rf"b-every echo every 3600 s no {SHOWN} {relative} 0 0 0 1 {re.escape(task_id)}"
    assert re.fullmatch(pattern, every_row), every_row
    doc = json.loads(ok(cli("list", "--json")))
    assert doc["namespace"] == namespace
    assert [s["id"] for s in doc["schedules"]] == ["a-cron", "b-every"]
    assert [s["paused"] for s in doc["schedules"]] == [True, False]
    assert doc["schedules"][1]["counts"] == {**COUNTS_ZERO, "triggered": 1}
    assert doc["schedules"][1]["last_task"] == task_id


def test_show_prints_definition_state_and_recent_outcomes(cli: Any, namespace: str) -> None:
    ok(cli("upsert", "report", "echo", "--every", "86400", "--params", '{"n": 1}'))
    first = ok(cli("trigger", "report")).strip()
    second = ok(cli("trigger", "report")).strip()
    lines = rows(ok(cli("show", "report")))
    fields = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines[:12]}
    assert fields["id"] == "report" and fields["task"] == "echo"
    assert fields["params"] == '{"n": 1}' and fields["timing"] == "every 86400 s"
    assert fields["overlap"] == "skip" and fields["paused"] == "no"
    assert fields["last"] == f"task {second}"
    assert fields["counts"] == "fired 0, skipped 0, missed 0, triggered 2"
    assert fields["version"] == "3"
    assert "recent outcomes (2, newest last)" in lines
    outcome_rows = [line for line in lines if line.startswith("triggered ")]
    assert len(outcome_rows) == 2
    assert outcome_rows[0].endswith(first) and outcome_rows[1].endswith(second)  # newest last
    doc = json.loads(ok(cli("show", "report", "--json")))
    assert set(doc) == {"namespace", "schedule"} and doc["namespace"] == namespace
    recent = doc["schedule"]["recent"]
    assert [r["task_id"] for r in recent] == [first, second]
    assert set(recent[0]) == {"outcome", "tick", "at", "task_id", "count", "last"}
    assert (recent[0]["outcome"], recent[0]["count"], recent[0]["last"]) == ("triggered", 1, None)
    assert re.fullmatch(TIME, recent[0]["tick"]) and re.fullmatch(TIME, recent[0]["at"])


def test_show_without_outcomes_says_so(cli: Any) -> None:
    ok(cli("upsert", "quiet", "echo", "--every", "60"))
    assert rows(ok(cli("show", "quiet")))[-1] == "no outcomes yet"


@pytest.mark.parametrize("command", ["show", "pause", "resume", "trigger", "delete"])
def test_an_unknown_id_is_one_error_line(cli: Any, namespace: str, command: str) -> None:
    for extra in ((), ("--json",)):
        line = one_error_line(cli(command, "ghost", *extra))
        assert line == f"error: no schedule 'ghost' in namespace {namespace!r}"


# -- pause / resume / trigger / delete ---------------------------------------------------------


def test_pause_and_resume(cli: Any, store: RedisTaskStore, namespace: str) -> None:
    ok(cli("upsert", "p", "echo", "--every", "60"))
    assert ok(cli("pause", "p")) == "schedule p: paused\n"
    assert stored_state(store, "p")["paused"] is True
    doc = json.loads(ok(cli("pause", "p", "--json")))
    assert (doc["namespace"], doc["outcome"]) == (namespace, "already paused")
    assert doc["schedule"]["paused"] is True and doc["schedule"]["version"] == 2
    line = ok(cli("resume", "p")).strip()
    assert re.fullmatch(rf"schedule p: resumed, next tick {SHOWN}", line), line
    assert stored_state(store, "p")["paused"] is False
    doc = json.loads(ok(cli("resume", "p", "--json")))
    assert doc["outcome"] == "not paused" and doc["schedule"]["paused"] is False


def test_trigger_prints_the_task_id_and_the_task_is_there(
    cli: Any, store: RedisTaskStore, namespace: str
) -> None:
    ok(cli("upsert", "t", "echo", "--every", "3600", "--params", '{"x": [1, 2]}'))
    ok(cli("pause", "t"))  # a trigger fires a paused schedule too
    task_id = ok(cli("trigger", "t")).strip()
    assert re.fullmatch(r"t@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\.\d{6}\.trigger", task_id), task_id
    task = store.get(task_id)
    assert task is not None and task.name == "echo" and task.params == {"x": [1, 2]}
    doc = json.loads(ok(cli("trigger", "t", "--json")))
    assert set(doc) == {"namespace", "schedule_id", "task_id"}
    assert (doc["namespace"], doc["schedule_id"]) == (namespace, "t")
    assert doc["task_id"] != task_id and store.get(doc["task_id"]) is not None
    assert stored_state(store, "t")["counts"]["triggered"] == 2


def test_delete_removes_it_and_a_second_delete_says_so(
    cli: Any, store: RedisTaskStore, namespace: str
) -> None:
    ok(cli("upsert", "d", "echo", "--every", "60"))
    ok(cli("upsert", "e", "echo", "--every", "60"))
    assert ok(cli("delete", "d")) == "schedule d deleted (the tasks it created stay)\n"
    assert set(store.schedule_records()) == {"e"}
    line = one_error_line(cli("delete", "d"))
    assert line == f"error: no schedule 'd' in namespace {namespace!r}"
    doc = json.loads(ok(cli("delete", "e", "--json")))
    assert doc == {"namespace": namespace, "schedule_id": "e", "deleted": True}
    assert store.schedule_records() == {}


# -- a store without schedules -----------------------------------------------------------------


def test_a_store_without_schedules_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from chongming_redis import InMemoryTaskStore
    from chongming_redis.cli import schedules as schedules_cli
    from chongming_redis.cli.root import app as cli_app
    from tests.support.flaky_store import ProtocolOnlyStore

    bare = ProtocolOnlyStore(InMemoryTaskStore(), failing=())
    monkeypatch.setattr(schedules_cli, "open_store", lambda *a, **k: bare)
    store = ["--store", "sqlite:///nowhere/schedules.db"]  # parsed, never opened
    for args in (
        ["list"],
        ["show", "x"],
        ["upsert", "x", "echo", "--every", "5"],
        ["trigger", "x"],
    ):
        result = CliRunner().invoke(cli_app, ["schedules", *args, *store])
        assert result.exit_code == 1, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert lines == ["error: ProtocolOnlyStore keeps no schedules (no SchedulesStore)"], args


@pytest.mark.parametrize(
    "command", ["list", "show", "upsert", "pause", "resume", "trigger", "delete"]
)
def test_each_help_has_an_example(cli: Any, command: str) -> None:
    text = ok(cli(command, "--help"))
    assert f"Example: chongming-redis schedules {command}" in " ".join(text.split()), text
