"""Store wrappers for the controller tests: record every call, fail chosen methods on demand.

``RecordingStore(inner)`` forwards the 14 protocol methods and the runtime extensions
(``touch_fenced``, ``server_time``, ``bucket_counts``) to ``inner`` and records each call with
its outcome. While ``down`` is set, the methods named in ``failing`` raise ``StoreUnavailable``
without reaching ``inner`` (a network blip, or a partitioned worker with ``failing=ALL``).
``clock_skew`` is added to ``server_time()`` (a store whose clock is far from this process's).

``ProtocolOnlyStore`` is the same without the extensions: a third-party store that implements
the protocol and nothing more (``isinstance`` against every extension protocol is False).
``RecordingStore`` forwards neither ``commit_tasks`` nor ``start_tasks``: under it the runtime
takes the unbatched path on both stores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chongming_redis.errors import StoreUnavailable

PROTOCOL = (
    "create", "save", "get", "query", "counts", "append", "history", "touch",
    "submit_command", "claim_commands", "complete_command", "release_command", "prune", "close",
)  # fmt: skip
EXTENSIONS = ("touch_fenced", "server_time", "bucket_counts")
ALL = frozenset(PROTOCOL + EXTENSIONS) - {"close"}
#: What a blip takes away in the write-through tests: every write of a running task.
WRITES = frozenset({"save", "append", "touch", "touch_fenced"})
#: Attributes of the wrapped store that the runtime reads (the Redis client, for nudges).
FORWARDED = frozenset({"client", "namespace", "keys"})


@dataclass(frozen=True)
class Call:
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outcome: Any  # the return value, or the exception raised

    @property
    def failed(self) -> bool:
        return isinstance(self.outcome, BaseException)

    @property
    def task_id(self) -> str | None:
        """The task a per-task call is about (``save``/``create``/``append`` carry a record)."""
        if not self.args:
            return None
        first = self.args[0]
        return first if isinstance(first, str) else getattr(first, "task_id", None)

    @property
    def landed(self) -> bool:
        """Did this call change the store? (A fenced touch that returned False did not.)"""
        if self.failed:
            return False
        return not (self.method == "touch_fenced" and self.outcome is False)


class ProtocolOnlyStore:
    def __init__(
        self,
        inner: Any,
        *,
        failing: Iterable[str] = WRITES,
        clock_skew: timedelta = timedelta(0),
    ) -> None:
        self.inner = inner
        self.failing = frozenset(failing)
        self.clock_skew = clock_skew
        self.down = False
        self._lock = threading.Lock()
        self._calls: list[Call] = []

    def __getattr__(self, name: str) -> Any:
        if name in FORWARDED:
            return getattr(self.inner, name)
        raise AttributeError(name)

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def calls_of(self, method: str, task_id: str | None = None) -> list[Call]:
        return [
            c
            for c in self.calls
            if c.method == method and (task_id is None or c.task_id == task_id)
        ]

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.down and method in self.failing:
            error = StoreUnavailable(f"{method}: the store is unreachable (test outage)")
            self._record(Call(method, args, kwargs, error))
            raise error
        try:
            result = getattr(self.inner, method)(*args, **kwargs)
        except Exception as exc:
            self._record(Call(method, args, kwargs, exc))
            raise
        self._record(Call(method, args, kwargs, result))
        if method == "server_time":
            result = result + self.clock_skew
        return result

    def _record(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)


def _forward(method: str) -> Callable[..., Any]:
    def forward(self: ProtocolOnlyStore, *args: Any, **kwargs: Any) -> Any:
        return self._call(method, args, kwargs)

    forward.__name__ = method
    return forward


class RecordingStore(ProtocolOnlyStore):
    """``ProtocolOnlyStore`` plus the forwarded extensions."""


for _method in PROTOCOL:
    setattr(ProtocolOnlyStore, _method, _forward(_method))
for _method in EXTENSIONS:
    setattr(RecordingStore, _method, _forward(_method))
