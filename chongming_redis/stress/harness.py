"""The stress run: a real pool of worker processes behind a fault proxy, a private redis-server
with ``appendfsync always`` (or the user's ``--redis``; or a SQL store, ``--store``: see
``targets``), a seeded nemesis, then the checkers over the store's own records.

With ``--redis`` the faults that need a server the run started itself (``redis_restart``, the
final kill -9 and restart) are skipped, and so are the proxy's faults when the workers cannot
reach that Redis through a plain TCP proxy (``rediss://`` and ``unix://`` URLs, and a Redis
Cluster: ``--redis URL --cluster``); the report's ``faults_skipped`` says which and why.

Layout of one run (``--keep`` leaves it on disk):

* ``driver.jsonl``: the driver's client log, one JSON line per op (submit / control / fault),
  ``outcome`` ``ok`` (acknowledged), ``fail`` (refused) or ``info`` (indeterminate);
* ``worker-<n>.log``: each worker process's stderr;
* ``oplog/ops-<pid>.jsonl``: every store call of the workers and of the driver, for the
  linearizability check (``stress/oplog.py``);
* the redis-server's directory (AOF) when the run started its own (``--store``: the SQLite
  file, the private PostgreSQL's directory).
"""

from __future__ import annotations

import itertools
import os
import random
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chongming_redis
from chongming_redis.embedded.workers import WorkerProcesses
from chongming_redis.env import AUDIT_ENV, CLUSTER_ENV
from chongming_redis.errors import StoreError
from chongming_redis.model import TaskQuery, TaskStatus
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.runtime.controller import Controller
from chongming_redis.stress import app as stress_app
from chongming_redis.stress import oplog
from chongming_redis.stress.faults import Nemesis, schedule
from chongming_redis.stress.feed_watch import FeedWatch
from chongming_redis.stress.plumbing import ClientLog, libfaketime, quiet_between, upstream_of
from chongming_redis.stress.policy_report import PolicyRun, stall_windows
from chongming_redis.stress.producer import (
    graph_clumps,
    limit_clumps,
    submit_until_known,
    unacknowledged,
    workload,
)
from chongming_redis.stress.report import VIOLATION_KINDS, collect, verdict
from chongming_redis.stress.soak import Soak, SoakPlan, fault_plan
from chongming_redis.stress.stress_store import StressStore
from chongming_redis.stress.targets import DRIVER, Target, prepare

__all__ = ["Options", "libfaketime", "policy_run", "run", "upstream_of", "worker_processes"]

APP = "chongming_redis.stress.app:app"
#: The workers' default retry policy's ``max_attempts`` (``--max-attempts``): what a task
#: without a policy of its own may use (``attempts_exceeded``).
WORKER_MAX_ATTEMPTS = 3
#: The run directory's operation logs (``stress/oplog.py``): the workers' and the driver's.
OPLOG_DIR = "oplog"


@dataclass
class Options:
    redis: str | None = None
    namespace: str | None = None
    workers: int = 3
    tasks: int = 150
    commands: int | None = None  # default: tasks // 8
    seconds: float = 20.0
    seed: int = 1
    keep: bool = False
    concurrency: int = 4
    num_buckets: int = 16
    task_lease: float = 2.0
    worker_lease: float = 2.0
    drain_seconds: float = 45.0
    unsafe: str | None = None  # negative control: CHONGMING_STRESS_UNSAFE for the workers
    workdir: str | None = None
    cluster: bool = False  # --redis names a node of a Redis Cluster
    #: ``--store``: a SQLite or PostgreSQL URL, or ``sqlite`` / ``postgresql`` alone (a new
    #: file in the run's directory / a private server); ``None``: Redis (``targets``)
    store: str | None = None
    #: Wall-clock ``(begin, end)`` of faults done beside the run (a test's reshard or
    #: failover), filled while it runs: the checkers that need a quiet pool leave them out.
    outside_faults: list[tuple[float, float]] = field(default_factory=list)
    #: ``--soak``: load, faults and removal for the whole window, memory sampled (``soak``)
    soak: SoakPlan | None = None


def worker_processes(opts: Options, target: Target, logdir: Path) -> WorkerProcesses:
    env = dict(os.environ)
    env.update({**target.app_env(), AUDIT_ENV: "1", oplog.OPLOG_ENV: str(logdir / OPLOG_DIR)})
    env.pop(CLUSTER_ENV, None)
    if opts.cluster:  # the workers' store and the stress app's client
        env[CLUSTER_ENV] = "1"
    if opts.unsafe:
        env[stress_app.UNSAFE_ENV] = opts.unsafe
    env.pop(stress_app.SOAK_RETENTION_ENV, None)
    if opts.soak:  # the tick tasks' retention: a soak removes every task
        env[stress_app.SOAK_RETENTION_ENV] = str(opts.soak.retention)
    source = Path(chongming_redis.__file__).resolve().parent.parent
    if (source / "pyproject.toml").exists():  # a source checkout: the workers import it too
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    options = [
        f"--concurrency={opts.concurrency}",
        f"--num-buckets={opts.num_buckets}",
        f"--task-lease={opts.task_lease}",
        f"--worker-lease={opts.worker_lease}",
        f"--max-attempts={WORKER_MAX_ATTEMPTS}",
        "--grace=2",
    ]
    return WorkerProcesses(APP, target.worker_url, target.namespace, options, logdir=logdir,
                           env=env, cwd=logdir)  # fmt: skip


def policy_run(opts: Options) -> PolicyRun:
    """The workers' policy settings, as ``worker_processes`` starts them: ``--max-attempts``,
    the reconcile interval the worker command derives from ``--task-lease``
    (``cli/worker.py``: half the lease, from 0.5 to 5 s) and the default ``timeout_grace``."""
    return PolicyRun(
        default_max_attempts=WORKER_MAX_ATTEMPTS,
        timeout_grace=ControllerConfig().timeout_grace,
        reconcile_interval=max(0.5, min(5.0, opts.task_lease / 2)),
        task_lease=opts.task_lease,
    )


def _server_time(store: StressStore) -> float | None:
    try:
        return store.server_time().timestamp()
    except StoreError:
        return None


def run(opts: Options) -> dict[str, Any]:
    """One stress run; returns the report (see ``report_keys`` in the docs)."""
    started = time.monotonic()
    rng = random.Random(opts.seed)
    namespace = opts.namespace or f"stress-{opts.seed}-{secrets.token_hex(3)}"
    made_workdir = opts.workdir is None
    workdir = Path(opts.workdir or tempfile.mkdtemp(prefix="chongming-stress-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        target = prepare(opts, namespace, workdir)
    except BaseException:
        if made_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    namespace = target.namespace  # a SQLite file holds one namespace: "default"
    log = ClientLog(workdir / "driver.jsonl")
    skipped = target.skipped
    faketime = libfaketime()
    if faketime is None:
        skipped.setdefault("clock_skew", "libfaketime is not installed (apt-get install faketime)")
    plan = (fault_plan(opts.seed, opts.seconds, target.kinds(), opts.soak.fault_spacing)
            if opts.soak else schedule(opts.seed, opts.seconds, target.kinds()))  # fmt: skip
    proxy = target.proxy
    # The driver's submits and control commands are writes: recorded too (unrecorded, they
    # would look like violations), from before its first call to after its last.
    recorder = oplog.install(workdir / OPLOG_DIR)
    store = target.open_store()
    driver = Controller(
        store, app=stress_app.app, owner=DRIVER, buckets=BucketPolicy(opts.num_buckets)
    )
    workers = worker_processes(opts, target, workdir)
    nodename = os.uname().nodename

    def holders() -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        running = store.query(TaskQuery(statuses=frozenset({TaskStatus.RUNNING})))
        for snap in running:
            owner = snap.lease_owner or ""
            if owner.startswith(nodename + "-") and owner.rsplit("-", 1)[1].isdigit():
                found.setdefault(int(owner.rsplit("-", 1)[1]), []).append(snap.task_id)
        return found

    def spawn_skewed(skew: int) -> int:
        assert faketime is not None  # not scheduled without it
        env = {"LD_PRELOAD": faketime, "FAKETIME": f"{skew:+d}s",
               "FAKETIME_DONT_FAKE_MONOTONIC": "1"}  # fmt: skip
        return workers.spawn(env=env, module="chongming_redis.stress.skewed")

    records = target.records(store)
    nemesis = Nemesis(
        plan, workers, proxy, target.server, holders, opts.task_lease, log,
        spawn_skewed=spawn_skewed,
        clock_of=lambda pid: stress_app.clock_of(records, namespace, pid),
    )  # fmt: skip
    submitted: list[str] = []  # every id the driver tried (acknowledged or not)
    planned_edges: dict[str, tuple[tuple[str, ...], str]] = {}  # child -> (parents, policy)
    acked_tasks: list[str] = []  # the tasks known to exist
    acked_submits: list[str] = []  # every acknowledged submit (a unique one may create none)
    unsafe = opts.unsafe or os.environ.get(stress_app.UNSAFE_ENV)
    watch = FeedWatch(store)
    acked_commands: list[str] = []
    n_commands = opts.commands if opts.commands is not None else max(5, opts.tasks // 8)
    stop_load = threading.Event()

    def submit(task_id: str, params: dict[str, Any], name: str = "step",
               unique: str | None = None, after: tuple[str, ...] = (),
               on_failure: str = "stop") -> None:  # fmt: skip
        submitted.append(task_id)
        if after:
            planned_edges[task_id] = (after, on_failure)
        if unsafe == "ignore-parents":  # a store that keeps no dependencies: all run at once
            after = ()
        retention = opts.soak.retention if opts.soak else None  # a soak removes every task
        returned = submit_until_known(driver, task_id, params, log, name=name, unique=unique,
                                      after=after, on_failure=on_failure,
                                      retention=retention)  # fmt: skip
        if returned is None:
            return
        acked_submits.append(task_id)
        if returned == task_id:
            acked_tasks.append(task_id)
            if unique is not None and unsafe == "ignore-policies":  # a store that forgets
                store.client.delete(store.keys.unique(unique))  # type: ignore[attr-defined]

    def submit_loop() -> None:
        window = opts.seconds * (1.0 if opts.soak else 0.85)  # a soak: the whole window
        for i in range(opts.tasks):
            target = started + window * i / max(1, opts.tasks)
            time.sleep(max(0.0, target - time.monotonic()))
            planned = workload(i, rng)
            submit(planned.task_id, planned.params, planned.name, planned.unique)
            for extra in limit_clumps(i):  # the limits' tasks, beside the load
                submit(extra.task_id, extra.params, extra.name)
            for node in graph_clumps(i):  # the dependencies' graphs, beside it too
                submit(node.task_id, node.params, node.name, after=node.after,
                       on_failure=node.on_failure)  # fmt: skip
        # The faults run one after another, so in a short window the last ones can start after
        # the planned load ended (a lease holder pause needs a RUNNING task): keep a trickle of
        # filler tasks (x00000, ...) coming until the nemesis is done — however long it takes
        # (a clock-skew fault late in the run waits for its new worker to run one).
        interval = max(0.05, window / max(1, opts.tasks))
        for j in itertools.count():
            if not nemesis.running() or stop_load.is_set():
                return
            time.sleep(interval)
            submit(f"x{j:05d}", {"steps": rng.randint(3, 8), "ms": rng.randint(10, 60)})

    def control(task_id: str, kind: str) -> None:
        try:
            outcome = getattr(driver, kind)(task_id)
        except StoreError as exc:
            log({"op": kind, "id": task_id, "outcome": "info", "error": str(exc)})
            return
        except ValueError as exc:
            log({"op": kind, "id": task_id, "outcome": "fail", "error": str(exc)})
            return
        if outcome.startswith("sent:"):
            acked_commands.append(outcome[5:])
        log({"op": kind, "id": task_id, "outcome": "ok", "result": outcome})

    def control_loop() -> None:
        crng = random.Random(opts.seed + 1)
        window = opts.seconds * (1.0 if opts.soak else 0.7)
        for i in range(n_commands):
            target = started + 1.0 + window * i / max(1, n_commands)
            time.sleep(max(0.0, target - time.monotonic()))
            if stop_load.is_set():
                return
            recent = acked_tasks[-20:]
            if not recent:
                continue
            kind = crng.choices(["stop", "pause", "resume"], [4, 3, 3])[0]
            control(crng.choice(recent), kind)

    workers_started = [workers.spawn() for _ in range(opts.workers)]
    workers.keep_alive()
    log(
        {
            "op": "start",
            "namespace": namespace,
            "workers": workers_started,
            "seed": opts.seed,
            "plan": [vars(f) for f in plan],
        }
    )
    watch.start()
    nemesis.start()
    threads = [
        threading.Thread(target=submit_loop, daemon=True),
        threading.Thread(target=control_loop, daemon=True),
    ]
    for t in threads:
        t.start()
    soak = None if opts.soak is None else Soak(
        opts.soak, store, namespace, lambda task_id: control(task_id, "resume"),
        watched=lambda: (len(watch.tasks), len(watch.removed_by)),
        out=workdir / "soak-samples.jsonl")  # fmt: skip
    if soak is not None:
        soak.start()
    time.sleep(max(0.0, started + opts.seconds - time.monotonic()))
    nemesis.join(60)
    stop_load.set()
    for t in threads:
        t.join(30)
    if soak is not None:  # the samples cover the load, not the drain
        soak.stop()
    if proxy is not None:
        proxy.clear()

    # Drain: resume whatever is paused, wait until every submitted task is terminal.
    drain_deadline = time.monotonic() + opts.drain_seconds
    while time.monotonic() < drain_deadline:
        try:
            live = [
                s
                for s in (store.get(t) for t in acked_tasks)
                if s is not None and not s.status.is_terminal
            ]
        except StoreError:
            time.sleep(0.5)
            continue
        if not live:
            break
        for snap in live:
            if snap.status is TaskStatus.PAUSED and snap.updated_at < store.server_time():
                control(snap.task_id, "resume")
        time.sleep(1.0)
    policies = policy_run(opts)
    policies.workers_stopped_at = _server_time(store)
    workers.stop_all()
    nemesis.join(10)
    watch.stop()
    if recorder is not None:
        recorder.close()  # every line on disk before the check reads them
    policies.watch, policies.driver_log = watch, log.records
    if target.kind == "sqlite":  # one write lock: a worker stopped in a write stalls them all
        policies.stalls = stall_windows(log.records, log.wall0)

    # The final restart: everything acknowledged must be read back from the AOF (the WAL).
    store, final_restart = target.final_restart(store)

    faults = [r for r in log.records if r.get("op") == "fault"]
    report = collect(store, target.truth(store), submitted, acked_tasks, acked_commands,
                     opts.concurrency,
                     quiet=quiet_between(faults, log.wall0, opts.task_lease,
                                         opts.outside_faults),
                     policies=policies, graphs=planned_edges,
                     oplog_dir=workdir / OPLOG_DIR)  # fmt: skip
    report.update(
        # every acknowledged submit: a task created, or (unique) the holder's id returned
        submitted=len(acked_submits),
        tasks_created=len(acked_tasks),
        seed=opts.seed,
        seconds=round(time.monotonic() - started, 1),
        workers=opts.workers,
        worker_processes_started=workers.spawned,
        worker_unexpected_exits=workers.unexpected_exits,
        # the tasks beside the planned --tasks: the trickle (x...) and the limits' (l...), and
        # the dependencies' graphs (g..., producer.graph_clumps)
        filler_tasks=sum(1 for t in acked_tasks if t.startswith(("x", "l"))),
        graph_tasks=sum(1 for t in acked_tasks if t.startswith("g")),
        # Why a submit stayed unacknowledged (its last log line), so a short count explains itself.
        unacknowledged_submits=unacknowledged(log.records, set(submitted) - set(acked_submits)),
        faults_scheduled=dict(nemesis.scheduled),
        faults_fired={k: nemesis.fired.get(k, 0) for k in nemesis.scheduled},
        proxy_fired=proxy.fired if proxy is not None else {},
        final_restart=final_restart,
        faults_skipped=skipped,
        namespace=namespace,
        store=target.kind,
        workdir=str(workdir),
        unsafe=unsafe,
    )
    missing = {
        k: n - nemesis.fired.get(k, 0)
        for k, n in nemesis.scheduled.items()
        if nemesis.fired.get(k, 0) < n
    }
    report["faults_missing"] = missing
    if soak is not None:
        report["soak"] = soak.report()
    report["fault_log"] = [r for r in log.records if r.get("op") == "fault"]
    report["violations"] = sum(report[k] for k in VIOLATION_KINDS)
    report["ok"] = verdict(report)
    report.update(target.finish(store, opts.keep))
    if not opts.keep and made_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return report
