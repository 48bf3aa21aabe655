"""The stress run's plumbing (``harness.run``): where Redis is for the driver and the workers
(``Upstream``: the fault proxy in between where it can be), the driver's client log, the
windows of the run that saw no fault, and the libfaketime the ``clock_skew`` fault preloads."""

from __future__ import annotations

import glob
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit


@dataclass(frozen=True)
class Upstream:
    """Where Redis is, as the driver and the workers see it."""

    url: str  # the driver's connection (direct)
    host: str | None  # for the fault proxy; None when the workers cannot be proxied
    port: int
    why_not_proxied: str = ""

    def through(self, proxy_port: int) -> str:
        """The URL the workers use: the user's, with the proxy as host and port."""
        parts = urlsplit(self.url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(("redis", f"{netloc}127.0.0.1:{proxy_port}", parts.path, parts.query, ""))


def upstream_of(url: str) -> Upstream:
    parts = urlsplit(url)
    if parts.scheme == "redis":
        return Upstream(url, parts.hostname or "127.0.0.1", parts.port or 6379)
    reason = {
        "rediss": "the workers reach Redis over TLS, which the fault proxy cannot read",
        "unix": "the workers reach Redis on a unix socket; the fault proxy speaks TCP",
    }.get(parts.scheme, f"the fault proxy cannot sit in front of a {parts.scheme}:// URL")
    return Upstream(url, None, 0, reason)


def quiet_between(
    faults: list[dict[str, Any]],
    wall0: float,
    task_lease: float,
    outside: Sequence[tuple[float, float]] = (),
) -> Callable[[float, float], bool]:
    """Whether a window of wall-clock time saw no fault: each fault counts from a second
    before it began until two task leases and the default start and reconcile intervals after
    its record (a stopped worker's tasks are LOST and retried by then). ``outside``: wall-clock
    ``(begin, end)`` of faults done beside the harness (a reshard, a failover), the same way."""
    spans = [(wall0 + f["at"], wall0 + f["t"]) for f in faults] + list(outside)
    windows = [(begin - 1.0, end + 2 * task_lease + 6.0) for begin, end in spans]

    def quiet(since: float, until: float) -> bool:
        return all(until < begin or since > end for begin, end in windows)

    return quiet


@dataclass
class ClientLog:
    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _t0: float = field(default_factory=time.monotonic)
    #: The wall clock at ``_t0``: a record's ``t`` as a time the histories use.
    wall0: float = field(default_factory=time.time)

    def __call__(self, record: dict[str, Any]) -> None:
        record = {"t": round(time.monotonic() - self._t0, 3), **record}
        with self._lock:
            self.records.append(record)
            with open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")


def libfaketime() -> str | None:
    """The libfaketime the ``clock_skew`` fault preloads (Debian's ``faketime`` package)."""
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                    "/usr/local/lib/faketime/libfaketime.so.1"):  # fmt: skip
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None
