"""The command lease audit: ``RedisTaskStore(audit=True)`` writes ``{ns}:audit`` from the
claim/complete/release scripts, and ``chongming_redis.stress.lease_audit.audit_command_leases``
replays it."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

from chongming_redis.model import Command, CommandKind
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress import lease_audit
from chongming_redis.stress.lease_audit import AuditEntry
from tests.support.redis_server import RedisProc

T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = 1_000_000  # one second in µs


def claim(cid: str, now: int, lease: int = 5 * S, owner: str = "") -> AuditEntry:
    return AuditEntry("claim", cid, now, now + lease, owner)


def release(cid: str, now: int, owner: str = "") -> AuditEntry:
    return AuditEntry("release", cid, now, None, owner)


def complete(cid: str, now: int, owner: str = "") -> AuditEntry:
    return AuditEntry("complete", cid, now, None, owner)


# -- the checker on hand-made audits ---------------------------------------------------------


def test_an_overlapping_claim_is_a_double_claim() -> None:
    found = lease_audit.check_command_leases([claim("c1", 0), claim("c1", 2 * S)])
    assert [(v.kind, v.task_id) for v in found] == [("double_claims", "c1")]


def test_claim_release_claim_complete_is_clean() -> None:
    audit = lease_audit.audit_command_leases(
        [claim("c1", 0), release("c1", S), claim("c1", 2 * S), complete("c1", 3 * S)]
    )
    assert audit.violations == []
    assert (audit.claims, audit.releases, audit.completes) == (2, 1, 1)
    assert audit.completions_without_lease == 0


def test_expired_then_reclaimed_is_clean() -> None:
    # the first lease ends at 5 s; a claim at exactly 5 s (lease_until <= now) is allowed
    assert lease_audit.check_command_leases([claim("c1", 0), claim("c1", 5 * S)]) == []
    assert lease_audit.check_command_leases([claim("c1", 0), claim("c1", 9 * S)]) == []


def test_leases_of_different_commands_do_not_interfere() -> None:
    assert lease_audit.check_command_leases([claim("c1", 0), claim("c2", S)]) == []


def test_two_completions_are_caught() -> None:
    found = lease_audit.check_command_leases([claim("c1", 0), complete("c1", S), complete("c1", S)])
    assert [(v.kind, v.task_id) for v in found] == [("duplicate_completions", "c1")]


def test_a_claim_after_completion_is_caught() -> None:
    found = lease_audit.check_command_leases(
        [claim("c1", 0), complete("c1", S), claim("c1", 9 * S)]
    )
    assert [v.kind for v in found] == ["double_claims"]


def test_completion_without_a_valid_lease_is_counted_not_a_violation() -> None:
    audit = lease_audit.audit_command_leases([claim("c1", 0), complete("c1", 7 * S)])
    assert audit.violations == []
    assert audit.completions_without_lease == 1
    # ... by an earlier holder: w1's lease ran out, w2 claimed and handed it back, w1 completes
    audit = lease_audit.audit_command_leases(
        [
            claim("c1", 0, owner="w1"),
            claim("c1", 6 * S, owner="w2"),
            release("c1", 6 * S + 1, owner="w2"),
            complete("c1", 7 * S, owner="w1"),
        ]
    )
    assert audit.violations == [] and audit.completions_without_lease == 1


# -- who holds the lease ----------------------------------------------------------------------


def _holder_violations(entries: list[AuditEntry]) -> list[tuple[str, str]]:
    return [(v.kind, v.task_id) for v in lease_audit.check_command_leases(entries)]


def test_completion_and_release_by_the_holder_are_clean() -> None:
    assert (
        _holder_violations(
            [
                claim("c1", 0, owner="w1"),
                release("c1", S, owner="w1"),
                claim("c1", 2 * S, owner="w2"),
                complete("c1", 3 * S, owner="w2"),
            ]
        )
        == []
    )


def test_completion_by_another_process_while_the_lease_is_valid_is_caught() -> None:
    entries = [claim("c1", 0, owner="w1"), complete("c1", S, owner="w2")]
    assert _holder_violations(entries) == [("command_holder", "c1")]
    detail = lease_audit.check_command_leases(entries)[0].detail
    assert "completed at 1000000 by w2 while the lease [0, 5000000) of w1 is valid" in detail


def test_completion_by_the_previous_holder_during_the_next_lease_is_caught() -> None:
    # w1's lease expired, w2 claimed it: w1 may no longer complete it
    entries = [
        claim("c1", 0, owner="w1"),
        claim("c1", 6 * S, owner="w2"),
        complete("c1", 7 * S, owner="w1"),
    ]
    assert _holder_violations(entries) == [("command_holder", "c1")]


def test_release_by_a_non_holder_is_caught() -> None:
    # a stale claimer clearing the current holder's lease would let a third process claim it
    entries = [
        claim("c1", 0, owner="w1"),
        claim("c1", 6 * S, owner="w2"),
        release("c1", 7 * S, owner="w1"),
    ]
    assert _holder_violations(entries) == [("command_holder", "c1")]


def test_completion_by_a_process_that_never_claimed_it_is_caught() -> None:
    assert _holder_violations([complete("c2", 0, owner="w9")]) == [("command_holder", "c2")]
    entries = [claim("c1", 0, owner="w1"), complete("c1", 7 * S, owner="w9")]
    assert _holder_violations(entries) == [("command_holder", "c1")]


def test_parse_audit_reads_xrange_replies() -> None:
    raw = [
        (b"1-0", {b"op": b"claim", b"cid": b"c1", b"until": b"15", b"now": b"10", b"owner": b"w"}),
        (b"2-0", {b"op": b"complete", b"cid": b"c1", b"until": b"", b"now": b"12", b"lu": b"15"}),
    ]
    assert lease_audit.parse_audit(raw) == [claim("c1", 10, 5, owner="w"), complete("c1", 12)]


# -- the scripts on a real Redis -------------------------------------------------------------


def _entries(store: RedisTaskStore) -> list[dict[str, str]]:
    raw: Any = store.client.xrange(store.keys.audit, "-", "+")
    return [{k.decode(): v.decode() for k, v in fields.items()} for _id, fields in raw]


def _sequence(store: RedisTaskStore) -> None:
    store.submit_command(Command("c1", "t1", CommandKind.STOP, T0))
    t1, t2, t3, t4 = (T0 + timedelta(seconds=s) for s in (1, 2, 3, 4))
    assert [c.command_id for c in store.claim_commands(now=t1, lease_seconds=10)] == ["c1"]
    store.release_command("c1", now=t2)
    store.release_command("c1", now=t2)  # not leased any more: nothing to audit
    assert [c.command_id for c in store.claim_commands(now=t3, lease_seconds=10)] == ["c1"]
    store.complete_command("c1", now=t4, outcome="stopped")
    store.complete_command("c1", now=t4, outcome="again")  # ALREADY: nothing to audit
    assert store.claim_commands(now=t4, lease_seconds=10) == []


def test_audit_on_records_exactly_the_lease_changes(redis_proc: RedisProc, namespace: str) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace, audit=True)
    # by default the owner a `chongming-redis worker` process gives its controller
    assert store.audit_owner == f"{os.uname().nodename}-{os.getpid()}"
    store.audit_owner = w = "w1"
    _sequence(store)
    us = [encode_dt(T0 + timedelta(seconds=s)) for s in range(15)]
    assert _entries(store) == [
        {"op": "claim", "cid": "c1", "until": str(us[11]), "now": str(us[1]), "owner": w},
        {"op": "release", "cid": "c1", "until": "", "now": str(us[2]), "lu": str(us[11]),
         "owner": w},
        {"op": "claim", "cid": "c1", "until": str(us[13]), "now": str(us[3]), "owner": w},
        {"op": "complete", "cid": "c1", "until": "", "now": str(us[4]), "lu": str(us[13]),
         "owner": w},
    ]  # fmt: skip
    audit = lease_audit.audit_command_leases(
        lease_audit.parse_audit(store.client.xrange(store.keys.audit))
    )
    assert audit.violations == [] and audit.completions_without_lease == 0
    store.close()


def test_the_audit_names_who_claimed_and_who_completed(
    redis_proc: RedisProc, namespace: str
) -> None:
    w1, w2 = (
        RedisTaskStore.from_url(redis_proc.url, namespace=namespace, audit=True, audit_owner=o)
        for o in ("w1", "w2")
    )
    w1.submit_command(Command("c1", "t1", CommandKind.STOP, T0))
    w1.submit_command(Command("c2", "t2", CommandKind.STOP, T0))
    t1, t2 = T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)
    assert {c.command_id for c in w1.claim_commands(now=t1, lease_seconds=10)} == {"c1", "c2"}
    w1.complete_command("c1", now=t2, outcome="stopped")  # the holder
    w2.complete_command("c2", now=t2, outcome="stopped")  # not the holder: the audit shows it
    entries = lease_audit.parse_audit(w1.client.xrange(w1.keys.audit))
    assert [(e.op, e.cid, e.owner) for e in entries] == [
        ("claim", "c1", "w1"),
        ("claim", "c2", "w1"),
        ("complete", "c1", "w1"),
        ("complete", "c2", "w2"),
    ]
    found = lease_audit.check_command_leases(entries)
    assert [(v.kind, v.task_id) for v in found] == [("command_holder", "c2")]
    w1.close()
    w2.close()


def test_audit_off_writes_nothing(redis_proc: RedisProc, namespace: str) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    assert store.audit is False
    _sequence(store)
    assert store.client.exists(store.keys.audit) == 0
    store.close()
