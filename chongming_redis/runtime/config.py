"""``ControllerConfig``: the timing and sizing parameters of a ``Controller``, in one frozen
record (the CLI and the tests pass one instead of ten keywords)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ControllerConfig:
    """Seconds unless named otherwise.

    ``command_poll_interval``: how often the holder looks for commands when not nudged.
    ``command_lease``: how long a claimed command stays this process's.
    ``task_lease``: the supervisor lease written on every held task (renewed every third).
    ``concurrency``: task slots (threads) of this process.
    ``prefetch``: at most this many started tasks wait for a free slot (0, the default: none,
    so ``RUNNING`` means a slot runs the task). With a prefetch the runner starts what its
    slots finish during one start round trip (``Window``): more throughput for tasks shorter
    than a round trip, but such a waiting task is ``RUNNING`` in the store before its function
    begins (``docs/runtime.md``, *Prefetch*).
    ``start_poll_interval``: how often the starter looks for work when not nudged.
    ``reconcile_interval``: how often expired leases are looked for.
    ``schedule_poll_interval``: how often the schedules of the buckets it holds are fired.
    ``release_poll_interval``: how often the releases of wide fan-outs (more waiting children
    than the write ending their parent moves itself) are continued (``runtime/releases.py``).
    ``progress_interval``: the supervisor's tick (progress and heartbeats are coalesced to it).
    ``stall_after``: a heartbeat older than this is reported as stalled (never made LOST).
    ``max_result_bytes``: the largest encoded result stored; a larger one fails the task.
    ``timeout_grace``: how long past its ``timeout`` an attempt that does not checkpoint may
    run before its worker ends it ``FAILED``/``TaskTimeout`` anyway (its thread's late result
    is discarded); a reconcile ends one still ``RUNNING`` past ``deadline + timeout_grace``
    whoever holds it.
    """

    command_poll_interval: float = 0.5
    command_lease: float = 30.0
    task_lease: float = 30.0
    concurrency: int = 4
    prefetch: int = 0
    start_poll_interval: float = 1.0
    reconcile_interval: float = 5.0
    schedule_poll_interval: float = 0.5
    release_poll_interval: float = 0.5
    progress_interval: float = 0.5
    stall_after: float = 300.0
    max_result_bytes: int = 1024 * 1024
    timeout_grace: float = 2.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{f.name} must be a number, not {type(value).__name__}")
            if not math.isfinite(value) or value < 0 or (value == 0 and f.name != "prefetch"):
                raise ValueError(f"{f.name} must be a positive finite number, not {value!r}")
        for name in ("concurrency", "prefetch", "max_result_bytes"):
            if not isinstance(getattr(self, name), int):
                raise TypeError(f"{name} must be an int")
