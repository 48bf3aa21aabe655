"""``WorkerMetrics``: a worker's ``WorkerEvents`` as Prometheus series, and ``serve``, the
``/metrics`` endpoint (``chongming-redis worker --metrics-port``; ``docs/runtime.md``,
*Metrics*, lists the series).

Each worker keeps its series in a registry of its own, never prometheus-client's global one:
two controllers in one process (tests, an embedding application) never collide. Under a
``--processes`` parent the series live in prometheus-client's multiprocess files instead
(``metrics/shared.py``): each child writes its own, and the parent serves their sum.
"""

from __future__ import annotations

from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from chongming_redis.errors import extra_imports

with extra_imports("metrics", "chongming_redis.metrics.worker"):
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        PlatformCollector,
        ProcessCollector,
        start_http_server,
    )
    from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from chongming_redis.runtime.events import (
    ENDINGS,
    OPERATIONS,
    Ending,
    RetryCause,
    WorkerEvents,
)
from chongming_redis.schedule_state import OUTCOMES

__all__ = ["DURATION_BUCKETS", "WorkerMetrics", "child_exited", "serve", "shared_registry",
           "worker_registry"]  # fmt: skip

#: Task run time, seconds: from a millisecond (a no-op task takes about 0.1 ms) to ten
#: minutes, about 2.5x apart; slower tasks count in ``+Inf`` only.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)  # fmt: skip


class WorkerMetrics(WorkerEvents):
    """The series of one worker, registered in ``registry``. ``tasks``: the app's task names,
    whose series start at 0 (a rate over a counter that appears at its first increment misses
    that increment)."""

    def __init__(self, registry: CollectorRegistry, tasks: Iterable[str] = ()) -> None:
        r = registry
        self.started = Counter("chongming_worker_tasks_started", "Task runs begun in this "
                               "worker, by task type.", ["task"], registry=r)  # fmt: skip
        self.finished = Counter("chongming_worker_tasks_finished", "Task runs ended in this "
                                "worker, by task type and how they ended (succeeded, failed, "
                                "stopped, lost).", ["task", "status"], registry=r)  # fmt: skip
        self.duration = Histogram("chongming_worker_task_duration_seconds", "Wall time of a "
                                  "task run, from its start to its end, by task type.",
                                  ["task"], buckets=DURATION_BUCKETS, registry=r)  # fmt: skip
        self.running = Gauge("chongming_worker_tasks_running", "Task runs begun and not yet "
                             "ended.", registry=r, multiprocess_mode="livesum")  # fmt: skip
        self.buckets = Gauge("chongming_worker_buckets_owned", "Buckets whose PENDING tasks "
                             "this worker starts (its share of the bucket pool).", registry=r,
                             multiprocess_mode="livesum")  # fmt: skip
        self.renewals = Counter("chongming_worker_lease_renewals", "Task leases renewed by the "
                                "supervisor (the first lease, written by the start, is not "
                                "counted).", registry=r)  # fmt: skip
        self.store_errors = Counter("chongming_worker_store_errors", "Store calls that failed "
                                    "(Redis unreachable, or a store error), by the worker's "
                                    "operation.", ["operation"], registry=r)  # fmt: skip
        self.reconnects = Counter("chongming_worker_reconnects", "Store outages that ended: "
                                  "the store answered again after failing.",
                                  registry=r)  # fmt: skip
        self.retries = Counter("chongming_worker_task_retries", "New attempts this worker "
                               "wrote, by task type and cause (failed, lost, timeout).",
                               ["task", "cause"], registry=r)  # fmt: skip
        self.timeouts = Counter("chongming_worker_task_timeouts", "Attempts ended for running "
                                "past their timeout, by task type.", ["task"],
                                registry=r)  # fmt: skip
        self.schedule_ticks_total = Counter("chongming_worker_schedule_ticks", "Schedule "
                                            "ticks this worker decided, by schedule and "
                                            "outcome (fired, skipped, missed, triggered).",
                                            ["schedule", "outcome"], registry=r)  # fmt: skip
        # The labelled children, looked up once per label set: labels() takes a lock and
        # checks its arguments on every call, and these are on every task's path.
        self._started: dict[str, Counter] = {}
        self._finished: dict[tuple[str, str], Counter] = {}
        self._durations: dict[str, Histogram] = {}
        self._schedules: set[str] = set()
        for operation in OPERATIONS:
            self.store_errors.labels(operation)
        for name in tasks:
            self._children(name)
            for ending in ENDINGS:
                self._finished_child(name, ending)

    def _children(self, name: str) -> tuple[Counter, Histogram]:
        started = self._started.get(name)
        if started is None:
            # The duration first: a thread that finds the counter finds both. Two threads
            # racing here label the same children twice, and labels() returns the same ones.
            self._durations[name] = self.duration.labels(name)
            started = self._started[name] = self.started.labels(name)
        return started, self._durations[name]

    def _finished_child(self, name: str, ending: str) -> Counter:
        child = self._finished.get((name, ending))
        if child is None:
            child = self._finished[(name, ending)] = self.finished.labels(name, ending)
        return child

    # -- WorkerEvents ----------------------------------------------------------------------

    def task_started(self, name: str) -> None:
        self._children(name)[0].inc()
        self.running.inc()

    def task_ended(self, name: str, ending: Ending, seconds: float) -> None:
        self._finished_child(name, ending).inc()
        self._children(name)[1].observe(seconds)
        self.running.dec()

    def leases_renewed(self, count: int) -> None:
        self.renewals.inc(count)

    def store_error(self, operation: str) -> None:
        self.store_errors.labels(operation).inc()

    def reconnected(self) -> None:
        self.reconnects.inc()

    def buckets_owned(self, count: int) -> None:
        self.buckets.set(count)

    def task_retried(self, name: str, cause: RetryCause) -> None:
        self.retries.labels(name, cause).inc()

    def task_timed_out(self, name: str) -> None:
        self.timeouts.labels(name).inc()

    def schedule_ticks(self, schedule_id: str, outcome: str, count: int) -> None:
        # A schedule's first report starts every outcome of it at 0 (its ids are not known
        # before: workers read them from the store).
        if schedule_id not in self._schedules:
            for each in OUTCOMES:
                self.schedule_ticks_total.labels(schedule_id, each)
            self._schedules.add(schedule_id)
        self.schedule_ticks_total.labels(schedule_id, outcome).inc(count)


def worker_registry() -> CollectorRegistry:
    """A lone worker's registry: its own series, its process's (CPU, memory, open files) and
    the Python version."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def shared_registry(path: str) -> CollectorRegistry:
    """The ``--processes`` parent's registry: the sum of its children's series, read from
    their files in ``path`` at each scrape."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]  # untyped there
    return registry


def serve(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """Serve ``registry`` over HTTP on ``host:port`` from a daemon thread (every path answers
    with the metrics; ``/metrics`` is the one to scrape). ``OSError`` when it cannot listen
    there (the port is taken, the host is not this machine's); ``shutdown()`` and
    ``server_close()`` stop it."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server


def child_exited(path: str, pid: int) -> None:
    """A child of a ``--processes`` parent exited: its gauges no longer count (its counters'
    and histograms' files stay, so the sums never go back)."""
    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]  # untyped there
