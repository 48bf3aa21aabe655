"""The command lease audit: ``RedisTaskStore(audit=True)`` writes ``{ns}:audit`` from the
claim/complete/release scripts, and ``chongming_redis.stress.checkers.audit_command_leases``
replays it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chongming_redis.model import Command, CommandKind
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress import checkers
from chongming_redis.stress.checkers import AuditEntry
from tests.support.redis_server import RedisProc

T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = 1_000_000  # one second in µs


def claim(cid: str, now: int, lease: int = 5 * S) -> AuditEntry:
    return AuditEntry("claim", cid, now, now + lease)


def release(cid: str, now: int) -> AuditEntry:
    return AuditEntry("release", cid, now, None)


def complete(cid: str, now: int) -> AuditEntry:
    return AuditEntry("complete", cid, now, None)


# -- the checker on hand-made audits ---------------------------------------------------------


def test_an_overlapping_claim_is_a_double_claim() -> None:
    found = checkers.check_command_leases([claim("c1", 0), claim("c1", 2 * S)])
    assert [(v.kind, v.task_id) for v in found] == [("double_claims", "c1")]


def test_claim_release_claim_complete_is_clean() -> None:
    audit = checkers.audit_command_leases(
        [claim("c1", 0), release("c1", S), claim("c1", 2 * S), complete("c1", 3 * S)]
    )
    assert audit.violations == []
    assert (audit.claims, audit.releases, audit.completes) == (2, 1, 1)
    assert audit.completions_without_lease == 0


def test_expired_then_reclaimed_is_clean() -> None:
    # the first lease ends at 5 s; a claim at exactly 5 s (lease_until <= now) is allowed
    assert checkers.check_command_leases([claim("c1", 0), claim("c1", 5 * S)]) == []
    assert checkers.check_command_leases([claim("c1", 0), claim("c1", 9 * S)]) == []


def test_leases_of_different_commands_do_not_interfere() -> None:
    assert checkers.check_command_leases([claim("c1", 0), claim("c2", S)]) == []


def test_two_completions_are_caught() -> None:
    found = checkers.check_command_leases([claim("c1", 0), complete("c1", S), complete("c1", S)])
    assert [(v.kind, v.task_id) for v in found] == [("duplicate_completions", "c1")]


def test_a_claim_after_completion_is_caught() -> None:
    found = checkers.check_command_leases([claim("c1", 0), complete("c1", S), claim("c1", 9 * S)])
    assert [v.kind for v in found] == ["double_claims"]


def test_completion_without_a_valid_lease_is_counted_not_a_violation() -> None:
    audit = checkers.audit_command_leases([claim("c1", 0), complete("c1", 7 * S)])
    assert audit.violations == []
    assert audit.completions_without_lease == 1
    audit = checkers.audit_command_leases([complete("c2", 0)])
    assert audit.violations == [] and audit.completions_without_lease == 1


def test_parse_audit_reads_xrange_replies() -> None:
    raw = [
        (b"1-0", {b"op": b"claim", b"cid": b"c1", b"until": b"15", b"now": b"10"}),
        (b"2-0", {b"op": b"complete", b"cid": b"c1", b"until": b"", b"now": b"12", b"lu": b"15"}),
    ]
    assert checkers.parse_audit(raw) == [claim("c1", 10, 5), complete("c1", 12)]


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
    _sequence(store)
    us = [encode_dt(T0 + timedelta(seconds=s)) for s in range(15)]
    assert _entries(store) == [
        {"op": "claim", "cid": "c1", "until": str(us[11]), "now": str(us[1])},
        {"op": "release", "cid": "c1", "until": "", "now": str(us[2]), "lu": str(us[11])},
        {"op": "claim", "cid": "c1", "until": str(us[13]), "now": str(us[3])},
        {"op": "complete", "cid": "c1", "until": "", "now": str(us[4]), "lu": str(us[13])},
    ]
    audit = checkers.audit_command_leases(
        checkers.parse_audit(store.client.xrange(store.keys.audit))
    )
    assert audit.violations == [] and audit.completions_without_lease == 0
    store.close()


def test_audit_off_writes_nothing(redis_proc: RedisProc, namespace: str) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    assert store.audit is False
    _sequence(store)
    assert store.client.exists(store.keys.audit) == 0
    store.close()
