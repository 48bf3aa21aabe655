"""The command lease audit of a stress run on Redis: the ``{ns}:audit`` stream entries
(``RedisTaskStore(audit=True)``), in stream order, which is the order the server executed the
command scripts in, replayed per command (docs/reliability.md: ``double_claims``,
``duplicate_completions`` and ``command_holder`` of the command leases). Plain data in,
:class:`Violation` out, as the other checkers (``stress/checkers.py``)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from chongming_redis.stress.checkers import Violation


@dataclass(frozen=True)
class AuditEntry:
    """One entry of the ``{ns}:audit`` stream: a lease change made by a command script."""

    op: str  # claim | complete | release
    cid: str
    now: int  # µs: the claim's now, the completion's finished_at, the release's now
    until: int | None  # µs: the lease a claim granted; None for complete/release
    owner: str = ""  # who claimed, completed or released (``RedisTaskStore.audit_owner``)


def parse_audit(entries: Iterable[Any] | None) -> list[AuditEntry]:
    """``XRANGE {ns}:audit - +`` (``[(entry_id, {field: value})]``) as audit entries,
    in stream order."""
    parsed = []
    for _entry_id, raw in entries or ():
        fields = {_str(k): _str(v) for k, v in raw.items()}
        until = fields.get("until", "")
        parsed.append(
            AuditEntry(
                op=fields["op"],
                cid=fields["cid"],
                now=int(fields["now"]),
                until=int(until) if until else None,
                owner=fields.get("owner", ""),
            )
        )
    return parsed


@dataclass
class LeaseAudit:
    violations: list[Violation]
    claims: int = 0
    completes: int = 0
    releases: int = 0
    #: completions with no valid lease at their ``finished_at``, by a process that held an
    #: earlier (expired) lease of the command (the protocol allows it, e.g. a stop command
    #: completed when its task finishes after the command lease ran out): informational.
    completions_without_lease: int = 0


@dataclass(frozen=True)
class _Lease:
    start: int
    until: int
    owner: str

    def valid_at(self, now: int) -> bool:
        return self.start <= now < self.until

    def __str__(self) -> str:
        return f"[{self.start}, {self.until}) of {self.owner or '?'}"


def audit_command_leases(entries: Iterable[AuditEntry]) -> LeaseAudit:
    """Replay the audit per command. Each claim opens the lease ``[now, until)`` of its
    ``owner``; a release or a completion ends it early. Violations:

    * ``double_claims``: a claim at ``now`` while another lease on the command is still valid
      (``until > now``), or a claim of a command that was already completed;
    * ``duplicate_completions``: a command completed more than once;
    * ``command_holder``: a command completed or released by anyone but the holder of its
      lease valid at that moment, or, when no lease is valid then, by a process that never
      held a lease of it.

    A completion while no lease is valid at its ``finished_at``, by an earlier holder, is
    counted in ``completions_without_lease``."""
    result = LeaseAudit([])
    lease: dict[str, _Lease] = {}  # cid -> its current (last granted, not ended) lease
    holders: defaultdict[str, set[str]] = defaultdict(set)  # cid -> every owner that claimed
    completed: Counter[str] = Counter()
    for e in entries:
        held = lease.get(e.cid)
        if e.op == "claim":
            result.claims += 1
            if completed[e.cid]:
                result.violations.append(
                    Violation("double_claims", e.cid, f"claimed at {e.now} after completion")
                )
            elif held is not None and held.until > e.now:
                result.violations.append(
                    Violation(
                        "double_claims",
                        e.cid,
                        f"claimed at {e.now} by {e.owner or '?'} while the lease {held} is valid",
                    )
                )
            lease[e.cid] = _Lease(e.now, e.until if e.until is not None else e.now, e.owner)
            holders[e.cid].add(e.owner)
            continue
        if e.op not in ("release", "complete"):
            detail = f"audit entry with unknown op {e.op!r}"
            result.violations.append(Violation("command_state", e.cid, detail))
            continue
        done = "released" if e.op == "release" else "completed"
        if held is not None and held.valid_at(e.now):
            if held.owner != e.owner:
                detail = f"{done} at {e.now} by {e.owner or '?'} while the lease {held} is valid"
                result.violations.append(Violation("command_holder", e.cid, detail))
        elif e.owner not in holders[e.cid]:
            detail = f"{done} at {e.now} by {e.owner or '?'}, which never held a lease of it"
            result.violations.append(Violation("command_holder", e.cid, detail))
        elif e.op == "complete":
            result.completions_without_lease += 1
        if e.op == "release":
            result.releases += 1
        else:
            result.completes += 1
            completed[e.cid] += 1
            if completed[e.cid] > 1:
                result.violations.append(
                    Violation(
                        "duplicate_completions",
                        e.cid,
                        f"command completed {completed[e.cid]} times (again at {e.now})",
                    )
                )
        lease.pop(e.cid, None)
    return result


def check_command_leases(entries: Iterable[AuditEntry]) -> list[Violation]:
    """The violations of :func:`audit_command_leases`."""
    return audit_command_leases(entries).violations


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value
