"""The soak run (``chongming-redis stress --soak MINUTES``): the stress run held for minutes at
a steady rate, with faults all the way through and finished tasks removed while it runs, to
show that Redis's memory per stored task stays flat (issue 29).

What differs from a bounded stress run (``harness.run`` takes a :class:`SoakPlan`):

* **Load.** The same workload mix (``producer.workload`` with its limit and graph clumps), at
  ``rate`` workload submits a second for the whole window (not the first 85%), and the
  commands over the whole window too.
* **Faults.** :func:`fault_plan`: one every ``fault_spacing`` seconds (a seeded draw between
  the two bounds) until the end of the window, the kinds dealt from a shuffled deck so every
  kind comes round once per ``len(kinds)`` faults.
* **Removal.** Every task has a short ``retention``: each driver submit carries it, and the
  schedule's tick tasks get it from their type (``stress_app.SOAK_RETENTION_ENV`` in the
  workers); the workers' retention sweep (``expire_finished``, on every reconcile) removes
  each that long after it finished, leaving a feed tombstone. Not the store's ``prune``: it
  removes the oldest finished tasks whatever their retention, which ``removed_early`` rightly
  reports as a task removed before its retention ran out (every task has one: 7 days by
  default). Tasks paused by a command for longer than ``RESUME_AFTER`` are resumed, as the
  drain does, so paused tasks do not pile up.
* **Samples** (:class:`Soak`), every ``sample_every`` seconds: ``used_memory`` (``INFO
  memory``), the stored tasks (``counts()``), the bytes and keys of each kind of key of the
  namespace (``MEMORY USAGE`` of every key, grouped by the kind after ``{ns}:``,
  ``stores/_redis/keys.py``) and of the harness's own records (``stress:{ns}:*``), the feed's
  size and tombstones, the driver's RSS and what the feed watch holds.

The verdict (:func:`summarize`) is on two figures over the second half of the window:
``per_task``, ``(used_memory - the harness's records) / stored tasks``, and
``store_per_task``, the bytes of the namespace's keys / stored tasks (without Redis's own
fixed overhead, which dominates the first with a few hundred tasks). A least-squares line is
fitted to each; the soak is ``flat`` when both lines move by less than ``FLAT_CHANGE`` (10%) of
their mean across the half. ``grew`` names each kind of key whose bytes grew by more than
``GREW_SHARE`` of the store's bytes over that half. ``verdict_live`` applies the same rule to
the bytes of the keys of live tasks alone (the store's keys less the ``FOREVER`` kinds, which
grow with every removed task or command by design and are measured apart in ``forever``).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from redis import RedisError

from chongming_redis.errors import StoreError
from chongming_redis.model import TaskQuery, TaskStatus
from chongming_redis.stress import app as stress_app
from chongming_redis.stress.faults import Fault
from chongming_redis.stress.stress_store import StressStore

#: Workload submits per second (each brings ~0.57 more in limit and graph clumps on average).
RATE = 3.0
#: Every task's retention (seconds) in a soak of 10 minutes or more: a few hundred stored.
RETENTION = 60.0
#: A task paused this long (seconds, by the server's clock) is resumed by the driver.
RESUME_AFTER = 10.0
#: The verdict's bound: the fitted line over the second half moves by less than this share.
FLAT_CHANGE = 0.10
#: A kind of key "grew" when it gained more than this share of the store's bytes in that half.
GREW_SHARE = 0.05
#: The harness's own records (``stress/app.py``): beside the store, not part of it.
HARNESS = "stress:"
#: The kinds of key that grow with every removed task or every command, as documented: their
#: cost is reported apart (``forever``) and left out of the ``live`` figure.
FOREVER = {
    "fc": "feed chunks: one tombstone per removed task, kept forever (cursors never expire, "
    "docs/feed.md)",
    "fcs": "the list of feed chunks: one entry per 128 feed positions in use",
    "c": "command hashes: each command stays readable by id after its task is removed "
    "(docs/store-extensions.md)",
    "audit": "the command lease audit (stress only: audit=True), capped at ~1,000,000 entries",
}


@dataclass(frozen=True)
class SoakPlan:
    """A soak's settings. ``for_minutes`` derives the retention, the sampling and the fault
    spacing from the length: for a 10-minute soak or longer a retention of 60 s, a sample
    every 20 s and a fault every 10-20 s; shorter (a test's), 10 s, 5 s and 4-8 s."""

    minutes: float
    rate: float = RATE
    retention: float = RETENTION
    sample_every: float = 20.0
    fault_spacing: tuple[float, float] = (10.0, 20.0)

    @classmethod
    def for_minutes(cls, minutes: float, rate: float = RATE) -> SoakPlan:
        if minutes >= 10:
            return cls(minutes, rate)
        return cls(minutes, rate, retention=10.0, sample_every=5.0, fault_spacing=(4.0, 8.0))

    @property
    def seconds(self) -> float:
        return self.minutes * 60

    @property
    def tasks(self) -> int:
        """The workload submits of the whole window."""
        return max(1, round(self.rate * self.seconds))


def fault_plan(seed: int, seconds: float, kinds: Sequence[str],
               spacing: tuple[float, float]) -> list[Fault]:  # fmt: skip
    """A fault every ``spacing`` seconds (drawn between its bounds) from the start to 5 s
    before the end of the window, the kinds dealt from a deck shuffled anew each round."""
    rng = random.Random(seed)
    plan: list[Fault] = []
    deck: list[str] = []
    at, end = min(2.0, seconds * 0.1), seconds - 5.0
    while kinds:
        at += rng.uniform(*spacing)
        if at > end:
            return plan
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        plan.append(Fault(round(at, 2), deck.pop(), rng.randrange(1, 1_000_000)))
    return plan


def kind_of(key: str, root: str) -> str:
    """The kind of a namespace key (``{ns}:t:x`` -> ``t``, ``{ns}:feed`` -> ``feed``), or of
    a harness record (``stress:{ns}:runs`` -> ``stress:runs``)."""
    if key.startswith(root):
        return key[len(root) :].split(":", 1)[0]
    return HARNESS + key.rsplit(":", 1)[-1]


def key_sizes(client: Any, keys: Any, namespace: str) -> dict[str, dict[str, int]]:
    """``{kind: {"count": n, "bytes": b}}`` over every key of the namespace (``keys``: the
    store's key builder) and the harness's records (``MEMORY USAGE ... SAMPLES 0``: every
    element counted)."""
    sizes: dict[str, dict[str, int]] = {}
    for pattern in (keys.glob(), stress_app.keys_pattern(namespace)):
        names = [k.decode() if isinstance(k, bytes) else k
                 for k in client.scan_iter(match=pattern, count=1000)]  # fmt: skip
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.memory_usage(name, samples=0)
        for name, used in zip(names, pipe.execute(), strict=True):
            entry = sizes.setdefault(kind_of(name, keys.root), {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += used or 0  # None: the key went meanwhile
    return sizes


def rss_bytes() -> int:
    """This process's resident set (the driver: its feed watch, its logs)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Soak:
    """The driver's side of a soak, in its own thread: every ``plan.sample_every`` seconds the
    resume of long-paused tasks, then a sample."""

    plan: SoakPlan
    store: StressStore  # a RedisTaskStore: ``client`` and ``keys`` are read
    namespace: str
    resume: Callable[[str], None]
    #: what the feed watch holds: ``(tasks, tombstones)`` it keeps in RAM
    watched: Callable[[], tuple[int, int]] = lambda: (0, 0)
    #: each sample is also appended here as a JSON line, as it is taken (a long soak's samples
    #: outlive a run that ends badly)
    out: Path | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0
    errors: list[str] = field(default_factory=list)
    _t0: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._t0 = time.monotonic()
        self.tick()  # the first sample: the empty namespace
        self._thread = threading.Thread(target=self._run, name="soak", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop, after one last sample (the end of the load)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self.tick()

    def _run(self) -> None:
        while not self._stop.wait(self.plan.sample_every):
            self.tick()

    def tick(self) -> None:
        for step in (self._resume_paused, self._sample):
            try:
                step()
            except (StoreError, RedisError) as exc:  # Redis restarting: the next tick
                self.errors.append(f"{step.__name__} at {self._elapsed():.0f}s: {exc}")

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _resume_paused(self) -> None:
        cutoff = self.store.server_time() - timedelta(seconds=RESUME_AFTER)
        for snap in self.store.query(TaskQuery(statuses=frozenset({TaskStatus.PAUSED}))):
            if snap.updated_at < cutoff:
                self.resume(snap.task_id)
                self.resumed += 1

    def _sample(self) -> None:
        client: Any = self.store.client  # type: ignore[attr-defined]
        used = int(client.info("memory")["used_memory"])
        counts = self.store.counts()
        sizes = key_sizes(client, self.store.keys, self.namespace)  # type: ignore[attr-defined]
        feed = self.store.feed_stats()
        watch_tasks, watch_tombs = self.watched()
        harness = sum(v["bytes"] for k, v in sizes.items() if k.startswith(HARNESS))
        store_bytes = sum(v["bytes"] for k, v in sizes.items() if not k.startswith(HARNESS))
        stored = sum(counts.values())
        self.samples.append({
            "t": round(self._elapsed(), 1),
            "used_memory": used,
            "harness_bytes": harness,
            "store_bytes": store_bytes,
            "stored": stored,
            "statuses": {s.value: n for s, n in counts.items() if n},
            "per_task": round((used - harness) / stored) if stored else None,
            "store_per_task": round(store_bytes / stored) if stored else None,
            "kinds": sizes,
            "feed_items": feed.items,
            "tombstones": feed.tombstones,
            "driver_rss": rss_bytes(),
            "watch_tasks": watch_tasks,
            "watch_tombstones": watch_tombs,
        })  # fmt: skip
        if self.out is not None:
            with self.out.open("a") as f:
                f.write(json.dumps(self.samples[-1], sort_keys=True) + "\n")

    def report(self) -> dict[str, Any]:
        return {
            "plan": asdict(self.plan),
            "samples": self.samples,
            "sample_errors": self.errors,
            "resumed_by_driver": self.resumed,
            **summarize(self.samples, self.plan.seconds),
        }


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares line ``(slope, intercept)`` through ``(x, y)`` points (two or more
    with distinct ``x``)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def _trend(points: Sequence[tuple[float, float]]) -> dict[str, float] | None:
    """A figure's fitted line over ``(seconds, value)`` points: its slope per minute, its mean
    and how far the line moves across the points, as a share of the mean."""
    if len(points) < 3 or points[-1][0] <= points[0][0]:
        return None
    slope, _ = fit(points)
    mean = sum(y for _, y in points) / len(points)
    moved = slope * (points[-1][0] - points[0][0])
    return {"per_minute": round(slope * 60, 1), "mean": round(mean, 1),
            "change": round(moved / mean, 4) if mean else 0.0}  # fmt: skip


def summarize(samples: Sequence[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """The verdict over the samples of the second half of the window (see the module
    docstring); ``verdict`` is ``None`` when there are too few samples to fit a line."""
    half = [s for s in samples if s["t"] >= seconds / 2 and s["stored"]]
    per_task = _trend([(s["t"], s["per_task"]) for s in half])
    store_per_task = _trend([(s["t"], s["store_per_task"]) for s in half])
    rule = ("flat when the least-squares lines of (used_memory - harness records) / stored "
            "tasks and of the namespace's key bytes / stored tasks over the second half each "
            f"move by less than {FLAT_CHANGE:.0%} of their mean")  # fmt: skip
    live = _trend([(s["t"], (s["store_bytes"] - _forever_bytes(s)) / s["stored"]) for s in half])
    return {
        "rule": rule,
        "verdict": _flat(per_task, store_per_task),
        "verdict_live": _flat(live),
        "second_half_samples": len(half),
        "per_task_trend": per_task,  # bytes per task; per_minute: bytes per task per minute
        "store_per_task_trend": store_per_task,  # the namespace's keys alone
        "live_per_task_trend": live,  # the namespace's keys less the FOREVER kinds
        "grew": grew(half),
        "forever": forever(samples),
    }


def _flat(*trends: dict[str, float] | None) -> str | None:
    if not trends or any(t is None for t in trends):
        return None
    moved = max(abs(t["change"]) for t in trends if t is not None)
    return "flat" if moved < FLAT_CHANGE else "not flat"


def _forever_bytes(sample: dict[str, Any]) -> int:
    return sum(int(sample["kinds"].get(k, {}).get("bytes", 0)) for k in FOREVER)


def forever(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the ``FOREVER`` kinds cost at the end, and per tombstone and per command (their
    growth from the first sample to the last over the tombstones and command hashes added)."""
    if not samples:
        return {}
    first, last = samples[0], samples[-1]

    def gained(kind: str, unit: str) -> int:
        then = first["kinds"].get(kind, {}).get(unit, 0)
        return int(last["kinds"].get(kind, {}).get(unit, 0) - then)

    tombs = last["tombstones"] - first["tombstones"]
    commands = gained("c", "count")
    feed_bytes = gained("fc", "bytes") + gained("fcs", "bytes")
    kinds = {k: {"why": why, **last["kinds"].get(k, {"count": 0, "bytes": 0})}
             for k, why in FOREVER.items()}  # fmt: skip
    return {
        "kinds": kinds,
        "tombstones": last["tombstones"],
        "bytes_per_tombstone": round(feed_bytes / tombs) if tombs else None,
        "command_hashes": last["kinds"].get("c", {}).get("count", 0),
        "bytes_per_command": round(gained("c", "bytes") / commands) if commands else None,
    }


def grew(half: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Each kind of key of the store that gained more than ``GREW_SHARE`` of the store's bytes
    from the first to the last sample of ``half``: its bytes and keys then and now."""
    if len(half) < 2:
        return {}
    first, last = half[0], half[-1]
    bound = GREW_SHARE * max(first["store_bytes"], 1)
    found = {}
    for kind, now in sorted(last["kinds"].items()):
        if kind.startswith(HARNESS):  # the checkers' records: they grow by design
            continue
        then = first["kinds"].get(kind, {"count": 0, "bytes": 0})
        if now["bytes"] - then["bytes"] > bound:
            found[kind] = {"bytes_then": then["bytes"], "bytes_now": now["bytes"],
                           "keys_then": then["count"], "keys_now": now["count"]}  # fmt: skip
    return found


def render(soak: dict[str, Any], out: Any) -> None:
    """The soak's lines under the run's table: the samples (thinned) and the verdict."""
    print("soak samples: t  used_memory  stored  per_task  store_per_task  tombstones  "
          "driver_rss", file=out)  # fmt: skip
    samples = soak["samples"]
    step = max(1, len(samples) // 20)
    for s in samples[::step]:
        print(f"  {s['t']:>7.1f}s {s['used_memory']:>11,} {s['stored']:>7} "
              f"{s['per_task'] or 0:>9,} {s['store_per_task'] or 0:>9,} "
              f"{s['tombstones']:>10,} {s['driver_rss']:>12,}", file=out)  # fmt: skip
    print(f"soak verdict: {soak['verdict']} ({soak['rule']}); trend {soak['per_task_trend']}; "
          f"store trend {soak['store_per_task_trend']}; grew {sorted(soak['grew']) or 'nothing'}; "
          f"resumed by the driver {soak['resumed_by_driver']}", file=out)  # fmt: skip
    more = {k: v for k, v in soak["forever"].items() if k != "kinds"}
    print(f"soak live tasks: {soak['verdict_live']} {soak['live_per_task_trend']}; "
          f"growing by design: {more}", file=out)  # fmt: skip
