"""The dashboard's ``/metrics``: the store's state in Prometheus' text format, read at scrape
time (so the values are the store's, never a stale copy). Every family carries a ``namespace``
label, so one Prometheus can scrape the dashboards of several namespaces.

The worker's own metrics (tasks started and finished, durations, renewals) are served by the
worker (``--metrics-port``); these are what only the store knows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from chongming_redis.dashboard.reads import Overview, read_overview, read_schedules
from chongming_redis.runtime.scheduling import StoredSchedule
from chongming_redis.schedule_state import OUTCOMES
from chongming_redis.stores.protocol import TaskStore


class StoreCollector(Collector):
    def __init__(self, store: TaskStore, namespace: str) -> None:
        self.store = store
        self.namespace = namespace

    def collect(self) -> Iterator[Metric]:
        ov = read_overview(self.store)
        ns = self.namespace
        tasks = GaugeMetricFamily("chongming_tasks", "Tasks in the store by status.",
                                  labels=["namespace", "status"])  # fmt: skip
        for status, n in ov.counts.items():
            tasks.add_metric([ns, status.value], n)
        yield tasks
        per_bucket = GaugeMetricFamily("chongming_bucket_tasks", "Tasks by bucket and status.",
                                       labels=["namespace", "bucket", "status"])  # fmt: skip
        owned = GaugeMetricFamily("chongming_bucket_owned",
                                  "1 when a live worker holds the bucket's lease, else 0.",
                                  labels=["namespace", "bucket"])  # fmt: skip
        for row in ov.buckets:
            for status, n in row.counts.items():
                per_bucket.add_metric([ns, str(row.bucket), status.value], n)
            owned.add_metric([ns, str(row.bucket)], 0 if row.owner is None else 1)
        yield per_bucket
        yield owned
        workers = GaugeMetricFamily("chongming_workers_live", "Workers with a valid heartbeat.",
                                    labels=["namespace"])  # fmt: skip
        workers.add_metric([ns], len(ov.workers))
        yield workers
        if ov.backlog is not None:
            backlog = ov.backlog
            yield _gauge(
                "chongming_commands_unclaimed",
                "Unfinished commands no worker has claimed.",
                ns,
                backlog.unclaimed,
            )
            yield _gauge(
                "chongming_commands_leased",
                "Unfinished commands a worker has claimed.",
                ns,
                backlog.leased,
            )
            yield _gauge("chongming_command_oldest_unclaimed_age_seconds",
                         "Age of the oldest unclaimed command (0 when there is none).", ns,
                         ov.oldest_unclaimed_age or 0.0)  # fmt: skip
        if ov.limits is not None:
            yield from _limit_gauges(ns, ov)
        schedules = read_schedules(self.store)
        if schedules is not None:
            yield from _schedule_metrics(ns, schedules)
        if ov.feed is not None:
            yield _gauge("chongming_feed_head", "The change feed's last position issued.", ns,
                         ov.feed.head)  # fmt: skip
            yield _gauge("chongming_feed_items",
                         "Items in the change feed: one per live task plus every tombstone.", ns,
                         ov.feed.items)  # fmt: skip
            yield _gauge("chongming_feed_tombstones",
                         "Tombstones of pruned tasks the feed keeps (they only grow).", ns,
                         ov.feed.tombstones)  # fmt: skip


def _limit_gauges(namespace: str, ov: Overview) -> Iterator[Metric]:
    """Per limit id: the tasks holding it (``RUNNING``/``PAUSED``; always 0 for a rate limit)
    and the ``PENDING`` tasks a start passed over because of it, summed over its keys."""
    held = GaugeMetricFamily("chongming_limit_held",
                             "Tasks holding a slot of the limit (RUNNING or PAUSED).",
                             labels=["namespace", "limit"])  # fmt: skip
    waiting = GaugeMetricFamily("chongming_limit_waiting",
                                "PENDING tasks a start passed over because of the limit.",
                                labels=["namespace", "limit"])  # fmt: skip
    for row in ov.limits or ():
        held.add_metric([namespace, row.limit_id], row.held)
        waiting.add_metric([namespace, row.limit_id], row.waiting)
    yield held
    yield waiting


def _schedule_metrics(namespace: str, schedules: Iterable[StoredSchedule]) -> Iterator[Metric]:
    """Per schedule: its ticks by outcome as the store counts them (every worker's, kept
    across restarts; a deleted schedule's series go with it) and whether it is paused."""
    ticks = CounterMetricFamily("chongming_schedule_ticks",
                                "Ticks of the schedule by outcome (fired, skipped, missed, "
                                "triggered), as the store counts them for the whole pool.",
                                labels=["namespace", "schedule", "outcome"])  # fmt: skip
    paused = GaugeMetricFamily("chongming_schedule_paused", "1 when the schedule is paused.",
                               labels=["namespace", "schedule"])  # fmt: skip
    for stored in schedules:
        sid = stored.schedule.id
        for outcome in OUTCOMES:
            ticks.add_metric([namespace, sid, outcome], stored.state.counts.get(outcome, 0))
        paused.add_metric([namespace, sid], 1 if stored.state.paused else 0)
    yield ticks
    yield paused


def _gauge(name: str, documentation: str, namespace: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["namespace"])
    family.add_metric([namespace], value)
    return family


def registry_for(store: TaskStore, namespace: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, namespace))
    return registry
