"""What ``report.collect`` reads after a stress run beside the store's public methods, per store
kind: the stress app's records, the fenced effects, the raw command records and their indexes,
the command lease audit and the limit holders.

* **Redis** (``RedisTruth``): everything from the store's Redis, as the run always read it: the
  app's lists (``stress:{ns}:runs``, ``effects``, ``began``), the command hashes and their
  queue (``cq``) and lease (``cl``) indexes, the ``{ns}:audit`` stream and the ``{ns}:lh:*``
  holder sets.
* **SQL** (``SqlTruth``: SQLite, PostgreSQL): the app's unfenced records (runs, began, clocks)
  from the private side Redis the run started for them (never faulted), the fenced effects, the
  command rows and ``limit_holders`` from the store's own database (``sql_records``). The
  command lease audit is a Redis script's stream: on SQL it does not exist, and its checks are
  listed in ``skipped_checks`` with the reason.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from chongming_redis.stress import app as stress_app
from chongming_redis.stress import lease_audit, sql_records

#: Why the command lease audit is not checked on a SQL store.
NO_AUDIT = ("the command lease audit ({ns}:audit) is a stream the Redis store's command "
            "scripts write; a SQL store keeps none, so only the command records are checked "
            "(command_state, acked_writes_lost)")  # fmt: skip


@dataclass
class GroundTruth(ABC):
    """The reads of one run's records; ``records``: the Redis client of the app's own lists."""

    namespace: str
    records: Any
    #: check -> why it was not run on this store
    skipped_checks: dict[str, str] = field(default_factory=dict)

    def runs(self) -> list[Any]:
        """The unfenced "began" records (``stress_app.runs_key``)."""
        return list(self.records.lrange(stress_app.runs_key(self.namespace), 0, -1))

    def began(self) -> list[Any]:
        """The limited types' begin times (``stress_app.began_key``)."""
        return list(self.records.lrange(stress_app.began_key(self.namespace), 0, -1))

    @abstractmethod
    def effects(self) -> list[Any]:
        """The fenced effect records."""

    @abstractmethod
    def commands(self, command_ids: list[str]) -> dict[str, dict[str, str]]:
        """Each command's raw record as the Redis hash's fields (``id t k c lu f o``)."""

    @abstractmethod
    def command_indexes(self) -> tuple[list[str], list[str]]:
        """The claimable commands (``queued``) and those a claim holds (``leased``)."""

    @abstractmethod
    def lease_audit(self) -> lease_audit.LeaseAudit | None:
        """The command lease audit replayed, ``None`` where the store keeps none."""

    @abstractmethod
    def limit_holders(self) -> dict[str, set[str]]:
        """Per limit ref, the tasks the store counts as holding a slot now."""


@dataclass
class RedisTruth(GroundTruth):
    """A Redis store's records; ``store`` is the ``RedisTaskStore`` (its ``client``, ``keys``)."""

    store: Any = None

    def effects(self) -> list[Any]:
        return list(self.records.lrange(stress_app.effects_key(self.namespace), 0, -1))

    def commands(self, command_ids: list[str]) -> dict[str, dict[str, str]]:
        found = {}
        for cid in command_ids:
            raw = self.records.hgetall(self.store.keys.command(cid))
            found[cid] = {_text(k): _text(v) for k, v in raw.items()}
        return found

    def command_indexes(self) -> tuple[list[str], list[str]]:
        keys = self.store.keys
        queued = [_text(m) for m in self.records.zrange(keys.command_queue, 0, -1)]
        leased = [_text(m) for m in self.records.zrange(keys.command_leases, 0, -1)]
        return queued, leased

    def lease_audit(self) -> lease_audit.LeaseAudit | None:
        entries = self.records.xrange(self.store.keys.audit, "-", "+")
        return lease_audit.audit_command_leases(lease_audit.parse_audit(entries))

    def limit_holders(self) -> dict[str, set[str]]:
        prefix = self.store.keys.limit_holders("")
        pattern = "\\{" + self.namespace + "\\}:lh:*"
        return {
            _text(key)[len(prefix) :]: {_text(m) for m in self.records.smembers(key)}
            for key in self.records.scan_iter(match=pattern, count=1000)
        }


@dataclass
class SqlTruth(GroundTruth):
    """A SQL store's records: ``store_url`` opens its database directly (not through a proxy);
    ``schema`` is the tables' schema on PostgreSQL (the namespace)."""

    store_url: str = ""
    schema: str = ""

    def __post_init__(self) -> None:
        self.skipped_checks.setdefault("command_lease_audit", NO_AUDIT)

    def effects(self) -> list[Any]:
        return list(sql_records.read_effects(self.store_url, self.schema))

    def commands(self, command_ids: list[str]) -> dict[str, dict[str, str]]:
        return sql_records.read_commands(self.store_url, self.schema, command_ids)

    def command_indexes(self) -> tuple[list[str], list[str]]:
        """A SQL claim picks the rows ``finished_at IS NULL`` with no valid lease, from the row
        itself: the unfinished commands are queued (no lease) or leased."""
        return sql_records.read_open_commands(self.store_url, self.schema)

    def lease_audit(self) -> lease_audit.LeaseAudit | None:
        return None

    def limit_holders(self) -> dict[str, set[str]]:
        return sql_records.read_limit_holders(self.store_url, self.schema)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
