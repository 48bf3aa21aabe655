"""The command lease model (``stress/lin_commands.py``) with the checker: hand-written command
histories, the attribution of unknown claims, the recording of the command calls
(``stress/oplog.py``) and the report; and a property: every sequential execution of the
in-memory reference store, recorded, is accepted (the model agrees with the store)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chongming_redis.errors import CommandAlreadyExists, CommandNotFound
from chongming_redis.model import Command, CommandKind
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stress import lin_history, oplog
from chongming_redis.stress import linearizability as lin
from chongming_redis.stress.lin_commands import (
    NOT_FOUND,
    Claim,
    CommandModel,
    CommandView,
    Complete,
    ReadCommand,
    ReleaseCommand,
    Submit,
    render,
)
from chongming_redis.stress.lin_history import Call, Logs
from chongming_redis.stress.lin_model import OK, Exists

MODEL = CommandModel()
S = 1_000_000  # one second in the model's microseconds
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def op(client: str, invoke: int, ret: int | None, call: Any, outcome: Any = OK) -> lin.Operation:
    return lin.Operation(client, invoke, ret, call, outcome)


def verdict(*ops: lin.Operation) -> str:
    return lin.check(list(ops), MODEL, render=render).status


def claim(
    client: str, invoke: int, ret: int | None, now_s: float, lease_s: float = 30
) -> lin.Operation:
    now = int(now_s * S)
    return op(client, invoke, ret, Claim(client, now, now + int(lease_s * S)))


SUBMITTED = op("p", 0, 5, Submit(None, None, None))


# -- hand-written histories ----------------------------------------------------------------


def test_two_ok_claims_of_one_command_within_one_lease_are_caught() -> None:
    first = claim("a", 10, 20, now_s=100)
    assert verdict(SUBMITTED, first, claim("b", 30, 40, now_s=129.999999)) == "violation"
    # overlapping in real time does not help: either order leaves one claim inside the other
    assert verdict(SUBMITTED, claim("a", 10, 40, 100), claim("b", 20, 30, 110)) == "violation"


def test_a_claim_after_the_lease_ran_out_by_the_callers_now_is_fine() -> None:
    # b's wall clock may be ahead of a's: the store judges the lease by the now b passes
    first = claim("a", 10, 20, now_s=100)
    assert verdict(SUBMITTED, first, claim("b", 30, 40, now_s=130)) == "linearizable"
    # ... and a claim whose now is behind the lease is refused even long after in real time
    assert verdict(SUBMITTED, first, claim("b", 10**12, 10**12 + 1, 129)) == "violation"


def test_complete_needs_only_a_present_command_not_the_lease_holder() -> None:
    # the protocol: anyone may complete a command, leased by another, expired or never claimed
    by_other = op("b", 30, 40, Complete(105 * S, "stopped"))
    assert verdict(SUBMITTED, claim("a", 10, 20, 100), by_other) == "linearizable"
    # where the store refuses (no such command) an accepted complete is caught, and the reverse
    assert verdict(op("b", 30, 40, Complete(1, None))) == "violation"
    assert verdict(SUBMITTED, op("b", 30, 40, Complete(1, None), NOT_FOUND)) == "violation"
    late_submit = op("p", 50, 60, Submit(None, None, None))
    assert verdict(op("b", 30, 40, Complete(1, None), NOT_FOUND), late_submit) == "linearizable"


def test_a_finished_command_is_never_claimed_and_keeps_its_first_outcome() -> None:
    done = op("a", 10, 20, Complete(5 * S, "stopped"))
    assert verdict(SUBMITTED, done, claim("b", 30, 40, 10**6)) == "violation"
    again = op("b", 30, 40, Complete(6 * S, "late"))
    seen = op("c", 50, 60, ReadCommand(), CommandView(None, 5 * S, "stopped"))
    assert verdict(SUBMITTED, done, again, seen) == "linearizable"
    replaced = op("c", 50, 60, ReadCommand(), CommandView(None, 6 * S, "late"))
    assert verdict(SUBMITTED, done, again, replaced) == "violation"
    # a release of a finished command leaves it finished
    released = op("b", 30, 40, ReleaseCommand())
    assert verdict(SUBMITTED, done, released, claim("c", 50, 60, 1)) == "violation"


def test_a_release_then_a_claim_within_the_old_lease_is_fine() -> None:
    first, second = claim("a", 10, 20, now_s=100), claim("b", 50, 60, now_s=101)
    assert verdict(SUBMITTED, first, second) == "violation"
    released = op("a", 30, 40, ReleaseCommand())
    assert verdict(SUBMITTED, first, released, second) == "linearizable"
    # by anyone (no holder check), but not before the claim it would undo
    assert verdict(SUBMITTED, op("b", 6, 8, ReleaseCommand()), first, second) == "violation"


def test_an_unknown_claim_may_have_happened_after_its_invoke_or_never() -> None:
    lost = claim("a", 10, None, now_s=100)
    assert verdict(SUBMITTED, lost, claim("b", 30, 40, now_s=101)) == "linearizable"
    leased = CommandView(130 * S, None, None)
    assert verdict(SUBMITTED, lost, op("c", 50, 60, ReadCommand(), leased)) == "linearizable"
    # ... but not before its invoke
    assert verdict(SUBMITTED, op("c", 6, 8, ReadCommand(), leased), lost) == "violation"


def test_submit_is_once_per_id_and_a_read_shows_a_preset_lease() -> None:
    preset = op("p", 0, 5, Submit(50 * S, None, None))
    assert verdict(preset, claim("a", 10, 20, 49)) == "violation"
    assert verdict(preset, claim("a", 10, 20, 50)) == "linearizable"
    assert verdict(SUBMITTED, op("q", 10, 20, Submit(None, None, None), Exists())) == "linearizable"
    assert verdict(SUBMITTED, op("q", 10, 20, Submit(None, None, None))) == "violation"
    assert verdict(op("a", 10, 20, ReadCommand(), None), SUBMITTED) == "violation"


# -- from recorded calls: attribution and the report ---------------------------------------


def call(client: str, at: int, ret: int | None, method: str, args: dict[str, Any],
         kind: str = "ok", result: Any = None) -> Call:  # fmt: skip
    return Call(client, at, ret, method, args, "unknown" if ret is None else kind, result)


SUBMIT = call("p", 0, 5, "submit_command", {"k": "c1", "l": None, "f": None, "o": None})
LOST_CLAIM = call("w1", 10, None, "claim_commands", {"w": 100 * S, "u": 130 * S})
READ_LEASED = call("r", 50, 60, "get_command", {"k": "c1"}, result=[130 * S, None, None])


def test_an_unknown_claim_is_attributed_only_to_the_commands_a_read_shows_leased_by_it() -> None:
    report = lin_history.check_records(Logs([SUBMIT, LOST_CLAIM, READ_LEASED]))
    assert report["violations"] == [] and report["commands"] == {"histories": 1, "operations": 3}
    # a lease no claim (ok or unknown) set is a violation that names the command
    other = call("r", 50, 60, "get_command", {"k": "c1"}, result=[131 * S, None, None])
    (found,) = lin_history.check_records(Logs([SUBMIT, LOST_CLAIM, other]))["violations"]
    assert found["command_id"] == "c1" and found["kind"] == "not_linearizable"
    assert "task_id" not in found and "leased until" in "\n".join(found["example"])
    # no read shows it: the unknown claim adds nothing to the command's history
    report = lin_history.check_records(Logs([SUBMIT, LOST_CLAIM]))
    assert report["commands"] == {"histories": 1, "operations": 1}


def test_command_ids_never_mix_with_task_ids_and_final_reads_come_from_read_command() -> None:
    create = call("p", 0, 5, "create", {"t": "c1", "v": 1, "s": "pending", "o": None})
    ok_claim = call("w1", 10, 20, "claim_commands", {"w": 100 * S, "u": 130 * S},
                    result=[["c1", 130 * S]])  # fmt: skip
    stored = Command("c1", "t", CommandKind.STOP, T0, lease_until=T0 + timedelta(seconds=1))
    report = lin_history.check_records(Logs([create, SUBMIT, ok_claim]),
                                       read_command=lambda cid: stored)  # fmt: skip
    assert report["histories"] == 1 and report["commands"] == {"histories": 1, "operations": 3}
    (found,) = report["violations"]  # the final read shows a lease no claim set
    assert found["command_id"] == "c1" and "final" in "\n".join(found["example"])


# -- the recording ---------------------------------------------------------------------------


def recorded_memory(recorder: oplog.Recorder) -> InMemoryTaskStore:
    cls = type("RecordedMemory", (InMemoryTaskStore,), {})
    return oplog.record_class(cls, recorder)()  # type: ignore[no-any-return]


def command(command_id: str, created: float = 0.0, **fields: Any) -> Command:
    return Command(command_id, "t1", CommandKind.STOP, T0 + timedelta(seconds=created), **fields)


def test_the_command_calls_are_recorded_with_their_outcomes(tmp_path: Path) -> None:
    recorder = oplog.Recorder(tmp_path)
    store = recorded_memory(recorder)
    store.submit_command(command("c1"))
    with pytest.raises(CommandAlreadyExists):
        store.submit_command(command("c1"))
    store.submit_command(command("c2", 1.0, lease_until=T0 + timedelta(seconds=5)))
    assert [c.command_id for c in store.claim_commands(now=T0, lease_seconds=2)] == ["c1"]
    store.release_command("c1", now=T0)
    later = T0 + timedelta(seconds=5)
    assert [c.command_id for c in store.claim_commands(now=later, lease_seconds=2)] == ["c1", "c2"]
    store.complete_command("c2", now=later, outcome="stopped")
    with pytest.raises(CommandNotFound):
        store.complete_command("nope", now=later)
    with pytest.raises(ValueError):  # refused before any I/O
        store.claim_commands(now=T0, lease_seconds=0)
    store.get_command("c2")
    recorder.close()
    (path,) = tmp_path.glob("ops-*.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    calls = [(r["m"], r["a"]) for r in records if r["e"] == "call"]
    t0, t5 = 1767225600 * S, 1767225605 * S
    assert calls[1] == ("submit_command", {"k": "c1", "l": None, "f": None, "o": None})
    assert calls[2] == ("submit_command", {"k": "c2", "l": t5, "f": None, "o": None})
    assert calls[3] == ("claim_commands", {"w": t0, "u": t0 + 2 * S})
    assert calls[6] == ("complete_command", {"k": "c2", "w": t5, "o": "stopped"})
    returns = [(r["e"], r["r"]) for r in records if r["e"] in ("ok", "fail", "unknown")]
    assert returns[1] == ("fail", ["exists"]) and returns[7] == ("fail", ["notfound"])
    assert returns[3] == ("ok", [["c1", t0 + 2 * S]])
    assert returns[5] == ("ok", [["c1", t5 + 2 * S], ["c2", t5 + 2 * S]])
    assert returns[8] == ("fail", ["refused", "ValueError"])
    assert returns[9] == ("ok", [t5 + 2 * S, t5, "stopped"])
    report = oplog.check_dir(tmp_path, read_command=store.get_command)
    assert report["violations"] == [] and report["unknown"] == []
    # c1: 2 submits, 2 claims, a release; c2: submit, claim, complete, read; "nope": a complete;
    # and a final read of each
    assert report["commands"] == {"histories": 3, "operations": 13}


# -- property: the model agrees with the in-memory reference store --------------------------

ACTIONS = st.lists(
    st.tuples(st.sampled_from(["submit", "claim", "complete", "release", "read"]),
              st.sampled_from(["c1", "c2", "c3"]), st.integers(0, 40), st.integers(1, 15)),
    max_size=25,
)  # fmt: skip


def _act(store: InMemoryTaskStore, action: str, cid: str, at: int, lease: int) -> None:
    now = T0 + timedelta(seconds=at)
    try:
        if action == "submit":
            store.submit_command(command(cid, created=lease))
        elif action == "claim":
            store.claim_commands(now=now, lease_seconds=lease, limit=2)
        elif action == "complete":
            store.complete_command(cid, now=now, outcome=f"o{lease}")
        elif action == "release":
            store.release_command(cid, now=now)
        else:
            store.get_command(cid)
    except (CommandAlreadyExists, CommandNotFound):
        pass  # recorded as refusals


@given(ACTIONS)
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
def test_every_sequential_execution_of_the_reference_store_is_accepted(
    tmp_path_factory: pytest.TempPathFactory, actions: list[tuple[str, str, int, int]]
) -> None:
    directory = tmp_path_factory.mktemp("ops")
    recorder = oplog.Recorder(directory)
    store = recorded_memory(recorder)
    for action in actions:
        _act(store, *action)
    recorder.close()
    report = oplog.check_dir(directory, read_command=store.get_command)
    assert report["violations"] == [] and report["unknown"] == []
