"""``report.unfinished_commands``: the report names each command the drain left unfinished and
whether a claim still held it (docs/reliability.md, "Why two commands were unfinished")."""

from __future__ import annotations

from chongming_redis.stress.report import unfinished_commands

FINISHED = {"id": "c1", "t": "t1", "k": "stop", "c": "1", "lu": "5", "f": "9", "o": "stopped"}
HELD = {"id": "c2", "t": "t2", "k": "stop", "c": "2", "lu": "40000000"}
QUEUED = {"id": "c3", "t": "t3", "k": "pause", "c": "3"}


def test_lists_only_the_unfinished_with_where_they_were() -> None:
    commands = {"c3": QUEUED, "c1": FINISHED, "c2": HELD, "gone": {}}
    assert unfinished_commands(commands, ["c2"]) == [
        {"cid": "c2", "task": "t2", "kind": "stop", "where": "leased", "lu": "40000000"},
        {"cid": "c3", "task": "t3", "kind": "pause", "where": "queued", "lu": ""},
    ]


def test_a_released_command_with_an_old_lease_end_is_queued_not_leased() -> None:
    released = {**HELD, "id": "c4"}
    assert unfinished_commands({"c4": released}, []) == [
        {"cid": "c4", "task": "t2", "kind": "stop", "where": "queued", "lu": "40000000"},
    ]


def test_nothing_unfinished_and_nothing_sent_give_an_empty_list() -> None:
    assert unfinished_commands({"c1": FINISHED}, []) == []
    assert unfinished_commands({}, []) == []
