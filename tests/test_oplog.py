"""The operation log (``stress/oplog.py``) and the per-task histories built from it
(``stress/lin_history.py``): what is recorded, how outcomes are read, a process killed mid-run,
and the attribution of an unknown batch start from the stored histories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.errors import StoreUnavailable
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stress import lin_history, oplog
from chongming_redis.stress.lin_history import Call, Logs
from tests.support.redis_server import RedisProc

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
P, R, W = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING


def task(task_id: str, version: int = 1, status: TaskStatus = P) -> TaskSnapshot:
    return TaskSnapshot(task_id, "step", status, version, NOW, NOW)


def recorded_memory(recorder: oplog.Recorder) -> InMemoryTaskStore:
    cls = type("RecordedMemory", (InMemoryTaskStore,), {})
    return oplog.record_class(cls, recorder)()  # type: ignore[no-any-return]


def lines(directory: Path) -> list[dict[str, Any]]:
    (path,) = directory.glob("ops-*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_modelled_call_is_recorded_with_its_outcome(tmp_path: Path) -> None:
    recorder = oplog.Recorder(tmp_path)
    store = recorded_memory(recorder)
    store.create(task("a"))
    with pytest.raises(Exception, match="already exists"):
        store.create(task("a"))
    store.get("a")
    store.save(task("a", 2, R), expect_version=1)
    with pytest.raises(Exception, match="expected version 1"):
        store.save(task("a", 2, R), expect_version=1)
    store.commit_tasks([(task("a", 3), 2, ()), (task("b"), None, ()), (task("c", 9), 8, ())])
    started = store.start_tasks(owner="w1", now=NOW, lease_until=NOW, buckets=[0], limit=5)
    assert {s.task_id for s in started} == {"a", "b"}
    assert store.touch_fenced("a", expect_version=4, lease_owner="w1") is True
    assert store.touch_fenced("a", expect_version=1, lease_owner="w1") is False
    store.touch("a", heartbeat_at=NOW)  # no lease owner: nothing the model needs
    store.touch("b", lease_owner="w2")
    store.create(task("d"))
    store.commit_and_start([(task("a", 5, TaskStatus.SUCCEEDED), 4, ())], owner="w1", now=NOW,
                           lease_until=NOW, buckets=[0])  # fmt: skip
    recorder.close()
    records = lines(tmp_path)
    assert [r["e"] for r in records[:1] + records[-1:]] == ["begin", "end"]
    calls = [r["m"] for r in records if r["e"] == "call"]
    # commit_and_start's own commit_tasks/start_tasks, start_tasks' reads: recorded once, outside
    assert calls == ["create", "create", "get", "save", "save", "commit_tasks", "start_tasks",
                     "touch_fenced", "touch_fenced", "touch", "create",
                     "commit_and_start"]  # fmt: skip
    returns = [(r["e"], r["r"]) for r in records if r["e"] in ("ok", "fail", "unknown")]
    assert returns[1] == ("fail", ["exists"])
    assert returns[2] == ("ok", [1, "pending", None])
    assert returns[4] == ("fail", ["conflict", 2])
    assert returns[5] == ("ok", [None, None, ["conflict", None]])
    assert sorted(returns[6][1]) == [["a", 4], ["b", 2]]
    assert returns[7:9] == [("ok", True), ("ok", False)]
    assert returns[11] == ("ok", {"c": [None], "s": [["d", 2]]})  # the slot a's end freed
    report = oplog.check_dir(tmp_path, final_snapshots={t: store.get(t) for t in "abcd"})
    assert report["violations"] == [] and report["unknown"] == []
    assert (report["histories"], report["processes"], report["unclean_exits"]) == (4, 1, 0)


class LostReplyStore(InMemoryTaskStore):
    """A save whose write lands but whose reply is lost: the client sees StoreUnavailable."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        super().save(snapshot, expect_version=expect_version)
        raise StoreUnavailable("connection reset (after the write)")


def test_an_error_after_the_call_is_an_unknown_outcome_that_may_have_happened(
    tmp_path: Path,
) -> None:
    recorder = oplog.Recorder(tmp_path)
    store = oplog.record_class(type("Rec", (LostReplyStore,), {}), recorder)()
    store.create(task("a"))
    with pytest.raises(StoreUnavailable):
        store.save(task("a", 2, R), expect_version=1)
    assert store.get("a").status_version == 2
    recorder.close()
    assert [r["e"] for r in lines(tmp_path)][3:5] == ["call", "unknown"]
    assert oplog.check_dir(tmp_path)["violations"] == []


WORKER = """
import os, signal, sys
from datetime import datetime, timezone
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress import oplog
oplog.install()
store = RedisTaskStore.from_url(sys.argv[1], namespace=sys.argv[2])
now = datetime.now(timezone.utc)
store.create(TaskSnapshot("k", "step", TaskStatus.PENDING, 1, now, now))
for v in range(1, 6):
    store.save(TaskSnapshot("k", "step", TaskStatus.PENDING, v + 1, now, now), expect_version=v)
    store.get("k")
if sys.argv[3] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("ending", ["exit", "kill"])
def test_install_records_a_process_named_by_the_environment_even_if_it_is_killed(
    tmp_path: Path, redis_proc: RedisProc, namespace: str, ending: str
) -> None:
    env = {**os.environ, oplog.OPLOG_ENV: str(tmp_path / "ops")}
    done = subprocess.run([sys.executable, "-c", WORKER, redis_proc.url, namespace, ending],
                          env=env, timeout=60)  # fmt: skip
    assert done.returncode == (-signal.SIGKILL if ending == "kill" else 0)
    records = lines(tmp_path / "ops")
    # every write's call line is on disk before the write is sent, whatever the ending
    assert [r["m"] for r in records if r["e"] == "call" and r["m"] != "get"] == ["create"] + [
        "save"
    ] * 5
    from chongming_redis.stores.redis import RedisTaskStore

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    report = oplog.check_dir(tmp_path / "ops", final_snapshots={"k": store.get("k")})
    store.close()
    assert report["violations"] == [] and report["histories"] == 1
    assert report["unclean_exits"] == (1 if ending == "kill" else 0)


def test_a_line_cut_by_a_kill_is_counted_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "ops-1.jsonl"
    path.write_text('{"e":"begin","pid":1,"t":0}\n'
                    '{"e":"call","n":1,"c":"1/1","t":5,"m":"create","a":{"t":"a","v":1,"s":"pending","o":null}}\n'
                    '{"e":"ok","n":1,"t":9,"r":nu')  # fmt: skip
    report = oplog.check_dir(tmp_path)
    assert (report["unreadable_lines"], report["operations"], report["violations"]) == (1, 1, [])


# -- an unknown batch start, attributed from the stored history ----------------------------


def call(method: str, invoke: int, ret: int | None, args: dict[str, Any], kind: str = "ok",
         result: Any = None, client: str = "1/1") -> Call:  # fmt: skip
    return Call(client, invoke, ret, method, args, "unknown" if ret is None else kind, result)


CREATE = call("create", 0, 10, {"t": "a", "v": 1, "s": "pending", "o": None})
START_LOST = call("start_tasks", 20, None, {"o": "w1"}, client="2/1")
STARTED = Transition("a", 2, P, R, NOW, "started by w1 (attempt 1)")
SUBMITTED = Transition("a", 1, None, P, NOW, "submitted")


def check(calls: list[Call], history: list[Transition], final: TaskSnapshot | None) -> Any:
    return lin_history.check_records(Logs(calls), {"a": history}, {"a": final})


def test_a_start_no_ok_call_explains_is_attributed_to_an_unknown_start_of_its_owner() -> None:
    running = TaskSnapshot("a", "step", R, 2, NOW, NOW, lease_owner="w1")
    assert check([CREATE, START_LOST], [SUBMITTED, STARTED], running)["violations"] == []
    # without the history the final read (v2 running) is a write nobody made
    (found,) = lin_history.check_records(Logs([CREATE, START_LOST]), None, {"a": running})[
        "violations"
    ]
    assert found["kind"] == "not_linearizable"
    # an unknown start of another owner explains nothing: a write nobody made
    other = call("start_tasks", 20, None, {"o": "w9"}, client="2/1")
    (found,) = check([CREATE, other], [SUBMITTED, STARTED], running)["violations"][:1]
    assert found["kind"] == "unexplained_start" and "w1" in found["example"][0]
    # an unknown start that was invoked only after a read saw v2: not the one
    seen = call("get", 12, 15, {"t": "a"}, result=[2, "running", "w1"], client="3/1")
    late = check([CREATE, seen, START_LOST], [SUBMITTED, STARTED], running)["violations"]
    assert [v["kind"] for v in late] == ["not_linearizable"]


def test_a_release_of_a_waiting_task_comes_from_the_stored_history() -> None:
    waiting = call("create", 0, 10, {"t": "a", "v": 1, "s": "waiting", "o": None})
    start = call("start_tasks", 20, 30, {"o": "w1"}, result=[["a", 3]], client="2/1")
    released = Transition("a", 2, W, P, NOW, "parents ended")
    started = Transition("a", 3, P, R, NOW, "started by w1 (attempt 1)")
    running = TaskSnapshot("a", "step", R, 3, NOW, NOW, lease_owner="w1")
    assert check([waiting, start], [released, started], running)["violations"] == []
    alone = lin_history.check_records(Logs([waiting, start]), {"a": [started]}, {"a": running})
    assert [v["kind"] for v in alone["violations"]] == ["not_linearizable"]


def test_a_forked_child_records_into_its_own_file(tmp_path: Path) -> None:
    recorder = oplog.Recorder(tmp_path)
    store = recorded_memory(recorder)
    store.create(task("parent"))
    pid = os.fork()
    if pid == 0:  # the child: its own file, its own begin line, a clean end
        store.create(task("child"))
        recorder.close()
        os._exit(0)
    os.waitpid(pid, 0)
    recorder.close()
    child = [json.loads(x) for x in (tmp_path / f"ops-{pid}.jsonl").read_text().splitlines()]
    assert [r["e"] for r in child] == ["begin", "call", "ok", "end"]
    assert child[1]["a"]["t"] == "child"
    assert oplog.check_dir(tmp_path)["processes"] == 2


def test_a_task_seen_absent_may_have_been_removed_by_a_prune_invoked_before() -> None:
    ended = call("save", 20, 30, {"t": "a", "x": 1, "v": 2, "s": "succeeded"})
    prune = call("prune", 40, 50, {}, result=1, client="9/1")
    gone = call("get", 60, 70, {"t": "a"}, result=None, client="3/1")
    assert check([CREATE, ended, prune, gone], [], None)["violations"] == []
    # no prune, or one invoked only after the read saw the task gone: nothing removed it
    assert check([CREATE, ended, gone], [], None)["violations"] != []
    late = call("prune", 80, 90, {}, result=1, client="9/1")
    assert check([CREATE, ended, gone, late], [], None)["violations"] != []
    # a prune never removes a task that is not final
    unfinished = call("save", 20, 30, {"t": "a", "x": 1, "v": 2, "s": "running"})
    assert check([CREATE, unfinished, prune, gone], [], None)["violations"] != []


def test_an_unknown_or_refused_commit_and_start_has_no_results_to_read() -> None:
    item = {"i": [["a", 1, 2, "succeeded", None]], "o": "w1"}
    done = TaskSnapshot("a", "step", TaskStatus.SUCCEEDED, 2, NOW, NOW)
    lost = call("commit_and_start", 20, None, item, result="StoreUnavailable")
    assert check([CREATE, lost], [SUBMITTED], done)["violations"] == []  # it may have happened
    refused = call("commit_and_start", 20, 30, item, kind="fail", result=["refused", "ValueError"])
    assert check([CREATE, refused], [SUBMITTED], task("a"))["violations"] == []
    assert check([CREATE, refused], [SUBMITTED], done)["violations"] != []  # it did not


def test_a_start_by_a_save_to_running_explains_its_history_entry() -> None:
    # a store without batched starts: a save to RUNNING, then the lease (StoreAdapter.start)
    save = call("save", 20, 30, {"t": "a", "x": 1, "v": 2, "s": "running"})
    lease = call("touch_fenced", 32, 35, {"t": "a", "x": 2, "o": "w1"}, result=True)
    running = TaskSnapshot("a", "step", R, 2, NOW, NOW, lease_owner="w1")
    assert check([CREATE, save, lease], [SUBMITTED, STARTED], running)["violations"] == []
    (found,) = check([CREATE, lease], [SUBMITTED, STARTED], running)["violations"][:1]
    assert found["kind"] == "unexplained_start"


def test_a_schedule_tick_creates_its_task_unless_the_id_exists() -> None:
    args = {"t": "a", "v": 1, "s": "pending", "o": None}
    read = call("get", 20, 30, {"t": "a"}, result=[1, "pending", None], client="3/1")
    tick = call("write_schedule", 0, 10, args, result=True)
    assert check([tick, read], [SUBMITTED], task("a"))["violations"] == []
    # "not created, the id exists" of a task nobody created is a violation
    existed = call("write_schedule", 0, 10, args, result=False)
    assert check([existed, read], [SUBMITTED], task("a"))["violations"] != []
    conflict = call("write_schedule", 0, 10, args, kind="fail",
                    result=["refused", "ScheduleConflict"])  # fmt: skip
    assert check([conflict], [], None)["violations"] == []  # nothing written


def test_install_moves_the_recording_to_a_new_directory_per_run(tmp_path: Path) -> None:
    cls = type("RecordedMemory", (InMemoryTaskStore,), {})
    recorder = oplog.install(tmp_path / "run1", classes=[cls])
    assert recorder is not None
    store = cls()
    store.create(task("a"))
    recorder.close()  # the harness closes it before the check
    store.create(task("unrecorded"))
    assert oplog.install(tmp_path / "run2", classes=[cls]) is recorder
    store.create(task("b"))
    recorder.close()
    first, second = lines(tmp_path / "run1"), lines(tmp_path / "run2")
    assert [r["e"] for r in first] == ["begin", "call", "ok", "end"]
    assert [r["e"] for r in second] == ["begin", "call", "ok", "end"]
    assert [r["a"]["t"] for r in first + second if r["e"] == "call"] == ["a", "b"]
