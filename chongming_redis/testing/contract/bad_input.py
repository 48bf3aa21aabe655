"""Bad input is refused before the store changes; awkward valid ids never collide."""

from __future__ import annotations

import unicodedata
from datetime import datetime

from chongming_redis import (
    Command,
    CommandKind,
    Transition,
)
from chongming_redis.stores.codec import MAX_PAYLOAD_BYTES
from chongming_redis.testing.contract.support import (
    AWKWARD_IDS,
    FAILED,
    MAX,
    MAX_CLAIM_LIMIT,
    NAIVE,
    PENDING,
    T0,
    ContractBase,
    at,
    command,
    counted,
    raises,
    snapshot,
    transition,
)
from chongming_redis.validation import check_identifier


class BadInputRules(ContractBase):
    # -- bad input ---------------------------------------------------------------------------

    def test_naive_datetimes_are_refused_when_a_record_is_built(self) -> None:
        naive = datetime(2024, 3, 10, 12, 0)
        raises(ValueError, snapshot, created_at=naive)
        raises(ValueError, snapshot, heartbeat_at=naive)
        raises(ValueError, Transition, "t1", 1, None, PENDING, naive)
        raises(ValueError, Command, "c1", "t1", CommandKind.STOP, naive)
        assert self.counts() == counted()

    def test_unusable_ids_are_refused_before_the_store_changes(self) -> None:
        self.put(snapshot("t1"))
        self.store.submit_command(command("c1"))
        for bad in ("", "x" * 1025, "é" * 512 + "x", "\ud800", "a\udfffb"):
            raises(ValueError, snapshot, bad)
            raises(ValueError, command, bad)
            raises(ValueError, self.store.get, bad)
            raises(ValueError, self.store.history, bad)
            raises(ValueError, self.store.touch, bad, heartbeat_at=at(1))
            raises(ValueError, self.store.complete_command, bad, now=at(1))
            raises(ValueError, self.store.release_command, bad, now=at(1))
        for wrong in (None, 1, b"t1"):
            raises(TypeError, self.store.get, wrong)
            raises(TypeError, self.store.touch, wrong, heartbeat_at=at(1))
        assert self.ids() == ["t1"]
        assert self.counts() == counted(pending=1)
        assert self.claimed(0) == ["c1"]

    def test_a_bool_or_float_version_is_refused(self) -> None:
        raises(TypeError, snapshot, version=True)
        raises(TypeError, snapshot, version=1.0)
        raises(TypeError, Transition, "t1", True, None, PENDING, T0)
        raises(ValueError, snapshot, version=-1)

    def test_wrong_record_types_are_refused_with_type_error(self) -> None:
        raises(TypeError, self.store.create, {"task_id": "t1"})
        raises(TypeError, self.store.save, None, expect_version=1)
        raises(TypeError, self.store.append, snapshot("t1"))
        raises(TypeError, self.store.submit_command, snapshot("t1"))
        assert self.counts() == counted()
        assert self.claimed(0) == []
        raises(TypeError, self.store.query, {"statuses": {PENDING}})

    def test_params_over_the_payload_limit_are_refused_and_nothing_is_created(self) -> None:
        huge = snapshot("huge", params=b"x" * (MAX_PAYLOAD_BYTES + 1))
        raises(ValueError, self.store.create, huge)
        assert self.store.get("huge") is None
        assert self.counts() == counted()
        raises(ValueError, self.store.submit_command, command("c1", payload=huge.params))
        assert self.claimed(0) == []

    def test_unserialisable_params_are_refused_and_nothing_is_created(self) -> None:
        for bad in (object(), {"nested": [object()]}, {1.5j: 1}):
            raises(TypeError, self.store.create, snapshot("bad", params=bad))
            raises(TypeError, self.store.submit_command, command("bad", payload=bad))
        assert self.store.get("bad") is None
        assert self.counts() == counted()
        assert self.claimed(0) == []

    def test_a_refused_payload_in_a_save_leaves_the_task_unchanged(self) -> None:
        before = snapshot("t1", params={"ok": True})
        self.put(before)
        huge = snapshot("t1", version=2, params=b"x" * (MAX_PAYLOAD_BYTES + 1))
        raises(ValueError, self.store.save, huge, expect_version=1)
        raises(
            TypeError, self.store.save, snapshot("t1", version=2, result=object()), expect_version=1
        )
        self.assert_untouched(before)
        self.store.save(snapshot("t1", version=2), expect_version=1)

    def test_awkward_but_valid_ids_round_trip_and_never_collide(self) -> None:
        assert len(set(AWKWARD_IDS)) == len(AWKWARD_IDS)
        assert unicodedata.normalize("NFC", "e\u0301") == "\u00e9"
        for i, task_id in enumerate(AWKWARD_IDS):
            self.store.create(snapshot(task_id, created=i, params={"id": task_id}))
            self.store.append(transition(task_id, 1, reason=task_id))
        for task_id in AWKWARD_IDS:
            got = self.store.get(task_id)
            assert got is not None and got.task_id == task_id, repr(task_id)
            assert got.params == {"id": task_id}, repr(task_id)
            assert self.store.history(task_id) == [transition(task_id, 1, reason=task_id)]
        assert self.ids() == list(AWKWARD_IDS)
        assert self.counts() == counted(pending=len(AWKWARD_IDS))

    def test_awkward_names_tags_and_pipeline_ids_filter_exactly(self) -> None:
        for i, text in enumerate(AWKWARD_IDS):
            self.store.create(
                snapshot(f"t{i}", name=text, tags={text}, pipeline_run_id=text, created=i)
            )
        for i, text in enumerate(AWKWARD_IDS):
            assert self.where(name=text) == [f"t{i}"], repr(text)
            assert self.where(tag=text) == [f"t{i}"], repr(text)
            assert self.where(pipeline_run_id=text) == [f"t{i}"], repr(text)
            expected = [f"t{j}" for j, other in enumerate(AWKWARD_IDS) if other.startswith(text)]
            assert self.where(name_prefix=text) == expected, repr(text)

    def test_awkward_command_ids_round_trip_and_never_collide(self) -> None:
        for i, command_id in enumerate(AWKWARD_IDS):
            self.store.submit_command(command(command_id, task_id=command_id, created=i))
        got = self.store.claim_commands(now=at(0), lease_seconds=5, limit=MAX_CLAIM_LIMIT)
        assert [c.command_id for c in got] == list(AWKWARD_IDS)
        assert all(c.task_id == c.command_id for c in got)
        self.store.complete_command("x", now=at(1))
        self.store.release_command("x:history", now=at(1))
        assert self.claimed(1) == ["x:history"]
        self.put(snapshot("same"))
        self.store.submit_command(command("same", task_id="same"))
        assert self.ids() == ["same"]
        assert self.claimed(0) == ["same"]

    # -- found by an independent review of the suite (round two) --------------------

    def test_integer_arguments_are_exact_ints_in_the_documented_range(self) -> None:
        self.put(snapshot("t1", status=FAILED))
        self.store.append(transition("t1", 1))
        raises(TypeError, self.store.save, snapshot("t1", version=2), expect_version=1.0)
        raises(TypeError, self.store.history, "t1", since_version=0.0)
        raises(TypeError, self.store.history, "t1", since_version=0.5)
        raises(TypeError, self.store.prune, keep_terminal=0.0)
        raises(ValueError, self.store.history, "t1", since_version=MAX + 1)
        raises(ValueError, self.store.prune, keep_terminal=MAX + 1)
        assert self.ids() == ["t1"] and len(self.store.history("t1")) == 1

    def test_bad_arguments_are_refused_whatever_the_store_holds(self) -> None:
        raises(ValueError, self.store.claim_commands, now=at(0), lease_seconds=0)
        raises(TypeError, self.store.claim_commands, now=at(0), lease_seconds=1, limit=True)
        raises(ValueError, self.store.claim_commands, now=NAIVE, lease_seconds=1)
        raises(ValueError, self.store.prune, keep_terminal=-1)
        raises(TypeError, self.store.prune, keep_terminal=True)
        raises(ValueError, self.store.history, "nobody", since_version=-1)
        raises(TypeError, self.store.history, "nobody", since_version=True)
        raises(ValueError, self.store.touch, "ghost", heartbeat_at=NAIVE)
        raises(ValueError, self.store.touch, "ghost", lease_owner="")
        raises(TypeError, self.store.touch, "ghost", progress={"current": 1})
        raises(ValueError, self.store.complete_command, "nope", now=NAIVE)
        raises(ValueError, self.store.release_command, "nope", now=NAIVE)

    def test_bad_arguments_are_refused_with_the_shared_messages(self) -> None:
        for bad in ("", "x" * 1025, "\ud800"):
            expected = str(raises(ValueError, check_identifier, bad, "task_id"))
            assert str(raises(ValueError, self.store.get, bad)) == expected

    def test_bad_arguments_are_refused_before_the_closed_check(self) -> None:
        self.close_store()
        raises(ValueError, self.store.get, "")

    def test_a_history_entry_at_version_zero_is_refused_when_it_is_built(self) -> None:
        raises(ValueError, Transition, "t1", 0, None, PENDING, T0)
        self.store.append(transition("t1", 1))
        assert self.store.history("t1") == [transition("t1", 1)]
