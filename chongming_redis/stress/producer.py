"""The driver's load (``workload``: which task each submit is, the task policies' share
included) and its submit, as a careful producer does it under faults.

A submit that ends in ``StoreError`` (Redis restarting longer than the store's own retries, a
reply lost) has an unknown outcome: the task may or may not exist. The producer tries again with
the same task id until it knows. ``TaskAlreadyExists`` after such an attempt means an earlier try
landed: the task is read back, and it counts as acknowledged only if it is there.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chongming_redis.errors import StoreError, TaskAlreadyExists
from chongming_redis.runtime.controller import Controller

#: How long one task's submit keeps trying before it stays indeterminate.
PATIENCE_SECONDS = 30.0
PAUSE_SECONDS = 0.5


def start_options(driver: Controller, task_id: str) -> dict[str, Any]:
    """The start options of a task, from its id (the same on every retry of its submit):
    priorities from -5 to 5, and one task in eight delayed by 0.2-1.9 s, so the start order,
    the delayed queues and the "no start before not_before" check meet faults too."""
    h = zlib.crc32(task_id.encode())
    options: dict[str, Any] = {"priority": h % 11 - 5}
    if h % 8 == 0:
        options["not_before"] = driver.clock.now() + timedelta(seconds=0.2 + (h >> 3) % 18 / 10)
    return options


@dataclass(frozen=True)
class Planned:
    """One submit of the load."""

    task_id: str
    name: str
    params: dict[str, Any]
    unique: str | None = None
    #: the parents it waits for (``submit(after=...)``) and its ``on_parent_failure``
    after: tuple[str, ...] = ()
    on_failure: str = "stop"


def workload(i: int, rng: random.Random) -> Planned:
    """The ``i``-th submit of the load: mostly ``step``; a small share (about a fifth) uses
    the task policies (``stress/app.py``): ``flaky`` (1 in 15: fails its first
    ``fail_until - 1`` attempts, 1 to 5, so some run out of their 3), ``slow`` (1 in 25:
    overruns its 1 s timeout silently or at checkpoints in its first attempt, or its first
    two, or not at all), ``brief`` (1 in 30: a retention of 3 s), and unique submits: for
    the ``k``-th of every 30, three submits of unique id ``u<k>`` of a ``step`` of about a
    second (at ``30k + 5``, ``+ 6``: its holder still unfinished, and ``+ 29``, about 2.7 s
    later with the default window: mostly finished). The seed's draws are the same whatever
    the share. The limits' tasks come beside this load (``limit_clumps``)."""
    steps = {"steps": rng.randint(3, 8), "ms": rng.randint(10, 60)}
    task_id, k = f"t{i:05d}", i // 30
    if i % 30 in (5, 6, 29):
        return Planned(task_id, "step", {"steps": 10, "ms": 100}, unique=f"u{k:03d}")
    if i % 25 == 9:
        j = i // 25
        mode = ("silent", "checkpoints", "quick")[j % 3]
        return Planned(task_id, "slow", {"mode": mode, "until": 2 + (j // 3) % 2})
    if i % 15 == 4:
        return Planned(task_id, "flaky", {**steps, "fail_until": 1 + (i // 15) % 5})
    if i % 30 == 10:
        return Planned(task_id, "brief", steps)
    return Planned(task_id, "step", steps)


def limit_clumps(i: int) -> list[Planned]:
    """The limits' tasks (``stress/app.py``), submitted right after the ``i``-th submit of
    ``workload``, beside the load (not instead of a part of it), one submit after the other,
    so limits that were not enforced would show: after ``30k + 14`` four ``limited`` tasks of
    key ``k<k mod 3>`` (about a second each: with ``max`` 2 they run two by two), after
    ``+ 22`` one of the next key, after ``+ 24`` four ``rated`` ones (one start a second:
    three of them wait). Their ids start with ``l`` (``l<i><a-d>``)."""
    k, at = i // 30, i % 30
    limited = {"steps": 10, "ms": 100}
    if at == 14:
        return [Planned(f"l{i:05d}{c}", "limited", {**limited, "key": f"k{k % 3}"})
                for c in "abcd"]  # fmt: skip
    if at == 22:
        return [Planned(f"l{i:05d}a", "limited", {**limited, "key": f"k{(k + 1) % 3}"})]
    if at == 24:
        return [Planned(f"l{i:05d}{c}", "rated", {"steps": 3, "ms": 20}) for c in "abcd"]
    return []


#: The submit after which the one wide fan-out of a run comes (its root, its children, a join).
FAN_OUT_AT, FAN_OUT_WIDTH = 40, 120


def graph_clumps(i: int) -> list[Planned]:
    """The dependencies' tasks (issue 28), submitted right after the ``i``-th submit of
    ``workload`` like the limits' clumps, parents first (ids ``g<i><letter>``): after
    ``30k + 17`` a diamond of ``step`` (``a``; ``b``, ``c`` after it; ``d`` after both); after
    ``+ 27`` a parent that fails for good (``flaky`` failing every attempt), a chain of two
    ``"stop"`` children after it (both must end ``STOPPED`` and never start) and a ``"run"``
    child (it runs once the parent has failed); after submit ``FAN_OUT_AT`` one fan-out of
    ``FAN_OUT_WIDTH`` short steps after a root, and a join after all of them (wider than one
    write releases: the workers' release loop finishes it under the faults)."""
    at, quick = i % 30, {"steps": 3, "ms": 20}
    g = f"g{i:05d}"
    found: list[Planned] = []
    if at == 17:
        found += [Planned(f"{g}a", "step", quick),
                  Planned(f"{g}b", "step", quick, after=(f"{g}a",)),
                  Planned(f"{g}c", "step", quick, after=(f"{g}a",)),
                  Planned(f"{g}d", "step", quick, after=(f"{g}b", f"{g}c"))]  # fmt: skip
    if at == 27:
        found += [Planned(f"{g}f", "flaky", {**quick, "fail_until": 99}),
                  Planned(f"{g}s", "step", quick, after=(f"{g}f",)),
                  Planned(f"{g}t", "step", quick, after=(f"{g}s",)),
                  Planned(f"{g}r", "step", quick, after=(f"{g}f",), on_failure="run")]  # fmt: skip
    if i == FAN_OUT_AT:
        kids = [Planned(f"{g}k{n:03d}", "step", {"steps": 1, "ms": 5}, after=(f"{g}w",))
                for n in range(FAN_OUT_WIDTH)]  # fmt: skip
        found += [
            Planned(f"{g}w", "step", quick),
            *kids,
            Planned(f"{g}j", "step", quick, after=tuple(k.task_id for k in kids)),
        ]
    return found


def submit_until_known(
    driver: Controller,
    task_id: str,
    params: dict[str, Any],
    log: Callable[[dict[str, Any]], None],
    *,
    name: str = "step",
    unique: str | None = None,
    after: tuple[str, ...] = (),
    on_failure: str = "stop",
    retention: float | None = None,
    patience: float = PATIENCE_SECONDS,
) -> str | None:
    """Submit ``name`` as ``task_id``; once acknowledged, the id it returned (``task_id``, or
    with ``unique`` held by another unfinished task, that task's), else ``None``. A unique
    submit's log line says what it returned (``returned``, ``created``) and brackets it in
    the driver's clock (``sent_at`` before the first try, ``acked_at``: seconds).
    ``retention``: the task's own (a soak's), over its type's."""
    deadline = time.monotonic() + patience
    unsure = False  # an earlier attempt may have created it
    policies: dict[str, Any] = {"unique": unique} if unique is not None else {}
    if after:
        policies.update(after=after, on_parent_failure=on_failure)
    if retention is not None:
        policies["retention"] = retention
    sent_at = driver.clock.now().timestamp()

    def acked(returned: str, **more: Any) -> str:
        line: dict[str, Any] = {"op": "submit", "id": task_id, "outcome": "ok", **more}
        if unique is not None:
            line.update(unique=unique, returned=returned, created=returned == task_id,
                        sent_at=sent_at, acked_at=driver.clock.now().timestamp())  # fmt: skip
        log(line)
        return returned

    while True:
        try:
            returned = driver.submit(name, params, task_id=task_id,
                                     **start_options(driver, task_id), **policies)  # fmt: skip
        except TaskAlreadyExists as exc:
            if unsure and _exists(driver, task_id, deadline):
                return acked(task_id, after="retry")
            # On a first try it is a store bug: the harness never submits an id twice, and a
            # create the store's client retried after a lost reply is recognised by its token
            # ('ct' on Redis) even once a worker has moved the task on.
            log({"op": "submit", "id": task_id, "outcome": "fail", "error": repr(exc)})
            return None
        except StoreError as exc:
            log({"op": "submit", "id": task_id, "outcome": "info", "error": str(exc)})
            if time.monotonic() + PAUSE_SECONDS > deadline:
                return None
            unsure = True
            time.sleep(PAUSE_SECONDS)
            continue
        except Exception as exc:  # a refused submit: nothing was written
            log({"op": "submit", "id": task_id, "outcome": "fail", "error": repr(exc)})
            return None
        return acked(returned)


def _exists(driver: Controller, task_id: str, deadline: float) -> bool:
    """The task reads back (a read that fails is tried again until ``deadline``: the store that
    just said "already exists" may be restarting)."""
    while True:
        try:
            return driver.store.get(task_id) is not None
        except StoreError:
            if time.monotonic() + PAUSE_SECONDS > deadline:
                return False
            time.sleep(PAUSE_SECONDS)


def unacknowledged(records: list[dict[str, Any]], task_ids: set[str]) -> dict[str, Any]:
    """``{task id: its last submit log line}`` for the submits never acknowledged."""
    last = {r["id"]: r for r in records if r.get("op") == "submit" and r.get("id") in task_ids}
    return {task_id: last.get(task_id) for task_id in sorted(task_ids)}
