"""``WorkerEvents``: what a running worker tells an observer (``Controller(events=...)``), for
metrics; ``chongming_redis.metrics.worker`` turns them into Prometheus series. Every method
here does nothing, so the runtime calls them unconditionally and an observer overrides only
what it needs.

The calls come from the worker's own threads (task threads, the supervisor, the loops, the pool
heartbeat), so an observer must be thread-safe and quick: ``task_started`` and ``task_ended``
are on every task's path. An observer that raises breaks the thread that called it.
"""

from __future__ import annotations

from typing import Final, Literal

#: How a task run ended, as ``task_ended`` reports it (the task log line's word).
Ending = Literal["succeeded", "failed", "stopped", "lost"]
ENDINGS: Final[tuple[Ending, ...]] = ("succeeded", "failed", "stopped", "lost")

#: Why a task got a new attempt, as ``task_retried`` reports it.
RetryCause = Literal["failed", "lost", "timeout"]
RETRY_CAUSES: Final[tuple[RetryCause, ...]] = ("failed", "lost", "timeout")

#: The ``operation`` of ``store_error``: which part of the worker could not reach the store.
#: A fixed set, so that a metric labelled by it stays small.
OPERATIONS: Final[tuple[str, ...]] = (
    "start",  # the starter: look for PENDING tasks and start them
    "commands",  # claim control commands
    "reconcile",  # mark expired leases LOST
    "pool",  # the bucket pool's heartbeat
    "write",  # write a held task's state (a finished task's included)
    "lease",  # renew a lease, write a heartbeat or progress
    "complete_command",  # answer a stop command once its task ended
    "supervise",  # anything else the supervisor's tick failed at
    "schedules",  # read or fire the schedules of the buckets it holds
)


class WorkerEvents:
    """The no-op observer; subclass it and override what you count."""

    def task_started(self, name: str) -> None:
        """The function of a task of type ``name`` begins to run here (its log line
        ``started``). A task stopped or handed back before it began never starts."""

    def task_ended(self, name: str, ending: Ending, seconds: float) -> None:
        """A task that started here ended, ``seconds`` after it started (wall clock). Each
        started task ends once, unless the process dies first; ``lost`` includes a task handed
        back at shutdown whose function was still running."""

    def leases_renewed(self, count: int) -> None:
        """The supervisor renewed ``count`` task leases in one tick (not the first lease,
        which the start writes)."""

    def store_error(self, operation: str) -> None:
        """A call to the store failed (unreachable, or a store error); ``operation`` is one of
        ``OPERATIONS``."""

    def reconnected(self) -> None:
        """The store answers again after an outage (the log's "reconnected to Redis after")."""

    def buckets_owned(self, count: int) -> None:
        """The bucket pool now gives this worker ``count`` buckets."""

    def task_retried(self, name: str, cause: RetryCause) -> None:
        """This worker wrote a task's next attempt after it ``failed``, was found ``lost`` or
        ran past its timeout (``timeout``: ended by the supervisor or a reconcile)."""

    def task_timed_out(self, name: str) -> None:
        """An attempt of a task of type ``name`` was ended for running past its timeout (by
        its holder, here, or by this worker's reconcile for a holder that did not)."""

    def schedule_ticks(self, schedule_id: str, outcome: str, count: int) -> None:
        """This worker decided ``count`` ticks of a schedule: ``outcome`` is one of
        ``schedule_state.OUTCOMES`` (``fired``, ``skipped``, ``missed``, ``triggered``)."""


#: The default observer of a ``Controller``.
NO_EVENTS: Final = WorkerEvents()
