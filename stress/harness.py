"""The stress run: a real pool of worker processes behind a fault proxy, a private redis-server
with ``appendfsync always``, a seeded nemesis, then the checkers over Redis's own records.

Layout of one run (``--keep`` leaves it on disk):

* ``driver.jsonl``: the driver's client log, one JSON line per op (submit / control / fault),
  ``outcome`` ``ok`` (acknowledged), ``fail`` (refused) or ``info`` (indeterminate);
* ``worker-<n>.log``: each worker process's stderr;
* the redis-server's directory (AOF) when the run started its own.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chongming_redis.cli import AUDIT_ENV
from chongming_redis.errors import StoreError
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore
from stress import app as stress_app
from stress import checkers
from stress.faults import KINDS, Nemesis, schedule

REPO = Path(__file__).resolve().parent.parent
VIOLATION_KINDS = (
    "duplicate_starts",
    "duplicate_completions",
    "double_claims",
    "duplicate_executions",
    "cas_chain",
    "history_gaps",
    "acked_writes_lost",
    "command_state",
)


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


class Workers:
    """The worker processes, tracked by pid (never killed by name)."""

    def __init__(self, opts: Options, url: str, namespace: str, logdir: Path) -> None:
        self.opts, self.url, self.namespace, self.logdir = opts, url, namespace, logdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.spawned = 0
        self.unexpected_exits = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def spawn(self) -> int:
        o = self.opts
        env = dict(os.environ)
        env.update(
            {
                stress_app.URL_ENV: self.url,
                stress_app.NS_ENV: self.namespace,
                AUDIT_ENV: "1",  # workers write the command lease audit
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
            }
        )
        if o.unsafe:
            env[stress_app.UNSAFE_ENV] = o.unsafe
        command = [
            sys.executable,
            "-m",
            "chongming_redis.cli",
            "worker",
            "stress.app:app",
            f"--redis={self.url}",
            f"--namespace={self.namespace}",
            f"--concurrency={o.concurrency}",
            f"--num-buckets={o.num_buckets}",
            f"--task-lease={o.task_lease}",
            f"--worker-lease={o.worker_lease}",
            "--grace=2",
        ]
        with self._lock:
            self.spawned += 1
            log = open(self.logdir / f"worker-{self.spawned}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
            log.close()
            self.procs[proc.pid] = proc
            return proc.pid

    def live_pids(self) -> list[int]:
        with self._lock:
            return sorted(p for p, proc in self.procs.items() if proc.poll() is None)

    def reap(self, pid: int) -> None:
        with self._lock:
            proc = self.procs.pop(pid, None)
        if proc is not None:
            proc.wait(10)

    def keep_alive(self) -> None:
        """Replace workers that exited on their own (e.g. Redis was down at their start)."""

        def loop() -> None:
            while not self._stop.wait(0.5):
                with self._lock:
                    dead = [p for p, proc in self.procs.items() if proc.poll() is not None]
                for pid in dead:
                    self.reap(pid)
                    self.unexpected_exits += 1
                    self.spawn()

        self._keeper = threading.Thread(target=loop, name="keeper", daemon=True)
        self._keeper.start()

    def stop_all(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(5)
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@dataclass
class ClientLog:
    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _t0: float = field(default_factory=time.monotonic)

    def __call__(self, record: dict[str, Any]) -> None:
        record = {"t": round(time.monotonic() - self._t0, 3), **record}
        with self._lock:
            self.records.append(record)
            with open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")


def _open_store(url: str, namespace: str) -> RedisTaskStore:
    return RedisTaskStore.from_url(
        url, namespace=namespace, socket_timeout=5, retries=3, audit=True
    )


def run(opts: Options) -> dict[str, Any]:
    """One stress run; returns the report (see ``report_keys`` in the docs)."""
    from tests.support.fault_proxy import FaultProxy
    from tests.support.redis_server import RedisProc

    started = time.monotonic()
    rng = random.Random(opts.seed)
    namespace = opts.namespace or f"stress-{opts.seed}-{secrets.token_hex(3)}"
    workdir = Path(opts.workdir or tempfile.mkdtemp(prefix="chongming-stress-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = ClientLog(workdir / "driver.jsonl")
    redis_proc = None if opts.redis else RedisProc()
    if redis_proc is not None:
        direct_url, port = redis_proc.url, redis_proc.port
    else:
        assert opts.redis is not None
        direct_url = opts.redis
        port = int(opts.redis.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    kinds = KINDS if redis_proc is not None else tuple(k for k in KINDS if k != "redis_restart")
    plan = schedule(opts.seed, opts.seconds, kinds)
    proxy = FaultProxy("127.0.0.1", port)
    store = _open_store(direct_url, namespace)
    driver = Controller(
        store, app=stress_app.app, owner="stress-driver", buckets=BucketPolicy(opts.num_buckets)
    )
    workers = Workers(opts, proxy.url, namespace, workdir)
    nodename = os.uname().nodename

    def holders() -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        running = store.query(TaskQuery(statuses=frozenset({TaskStatus.RUNNING})))
        for snap in running:
            owner = snap.lease_owner or ""
            if owner.startswith(nodename + "-") and owner.rsplit("-", 1)[1].isdigit():
                found.setdefault(int(owner.rsplit("-", 1)[1]), []).append(snap.task_id)
        return found

    nemesis = Nemesis(plan, workers, proxy, redis_proc, holders, opts.task_lease, log)
    submitted: list[str] = []  # every id the driver tried (acknowledged or not)
    acked_tasks: list[str] = []
    acked_commands: list[str] = []
    n_commands = opts.commands if opts.commands is not None else max(5, opts.tasks // 8)
    stop_load = threading.Event()

    def submit_loop() -> None:
        window = opts.seconds * 0.85
        for i in range(opts.tasks):
            target = started + window * i / max(1, opts.tasks)
            time.sleep(max(0.0, target - time.monotonic()))
            task_id = f"t{i:05d}"
            params = {"steps": rng.randint(3, 8), "ms": rng.randint(10, 60)}
            submitted.append(task_id)
            try:
                driver.submit("step", params, task_id=task_id)
            except StoreError as exc:
                log({"op": "submit", "id": task_id, "outcome": "info", "error": str(exc)})
                continue
            except Exception as exc:  # e.g. TaskAlreadyExists after a retried create
                log({"op": "submit", "id": task_id, "outcome": "fail", "error": repr(exc)})
                continue
            acked_tasks.append(task_id)
            log({"op": "submit", "id": task_id, "outcome": "ok"})

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
        window = opts.seconds * 0.7
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
    nemesis.start()
    threads = [
        threading.Thread(target=submit_loop, daemon=True),
        threading.Thread(target=control_loop, daemon=True),
    ]
    for t in threads:
        t.start()
    time.sleep(max(0.0, started + opts.seconds - time.monotonic()))
    stop_load.set()
    for t in threads:
        t.join(30)
    nemesis.join(60)
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
    workers.stop_all()
    nemesis.join(10)

    # The final restart: everything acknowledged must be read back from the AOF.
    final_restart = False
    if redis_proc is not None:
        store.close()
        redis_proc.kill9()
        redis_proc.restart()
        final_restart = True
        store = _open_store(direct_url, namespace)

    report = collect(store, namespace, submitted, acked_tasks, acked_commands)
    report.update(
        seed=opts.seed,
        seconds=round(time.monotonic() - started, 1),
        workers=opts.workers,
        worker_processes_started=workers.spawned,
        worker_unexpected_exits=workers.unexpected_exits,
        faults_scheduled=dict(nemesis.scheduled),
        faults_fired={k: nemesis.fired.get(k, 0) for k in nemesis.scheduled},
        proxy_fired=proxy.fired,
        final_restart=final_restart,
        namespace=namespace,
        workdir=str(workdir),
        unsafe=opts.unsafe or os.environ.get(stress_app.UNSAFE_ENV),
    )
    missing = {
        k: n - nemesis.fired.get(k, 0)
        for k, n in nemesis.scheduled.items()
        if nemesis.fired.get(k, 0) < n
    }
    report["faults_missing"] = missing
    report["fault_log"] = [r for r in log.records if r.get("op") == "fault"]
    report["violations"] = sum(report[k] for k in VIOLATION_KINDS)
    report["ok"] = report["violations"] == 0 and not missing
    proxy.close()
    store.close()
    if redis_proc is not None:
        if opts.keep:
            redis_proc.stop()
            report["redis_dir"] = str(redis_proc.dir)
        else:
            redis_proc.close()
    if not opts.keep:
        if opts.redis:
            _delete_namespace(direct_url, namespace)
        if opts.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return report


def collect(
    store: RedisTaskStore,
    namespace: str,
    submitted: list[str],
    acked_tasks: list[str],
    acked_commands: list[str],
) -> dict[str, Any]:
    """Read the ground truth from Redis and run every checker."""
    client = store.client
    finals: dict[str, TaskSnapshot | None] = {t: store.get(t) for t in submitted}
    histories: dict[str, list[Transition]] = {
        t: store.history(t) for t, snap in finals.items() if snap is not None
    }
    runs = client.lrange(stress_app.runs_key(namespace), 0, -1)
    effects = client.lrange(stress_app.effects_key(namespace), 0, -1)
    commands = {}
    for cid in acked_commands:
        raw = client.hgetall(store.keys.command(cid))
        commands[cid] = {_text(k): _text(v) for k, v in raw.items()}
    queued = [_text(m) for m in client.zrange(store.keys.command_queue, 0, -1)]
    leased = [_text(m) for m in client.zrange(store.keys.command_leases, 0, -1)]
    lease_audit = checkers.audit_command_leases(
        checkers.parse_audit(client.xrange(store.keys.audit, "-", "+"))
    )

    found = (
        checkers.check_starts(histories)
        + checkers.check_completions(histories)
        + checkers.check_cas_chain(histories, finals)
        + checkers.check_executions(runs, effects, histories)
        + checkers.check_durability(acked_tasks, finals, "task")
        + checkers.check_durability(acked_commands, commands, "command")
        + checkers.check_commands(commands, queued, leased)
        + lease_audit.violations
    )
    counts = checkers.count(found)
    statuses = Counter(s.status.value for s in finals.values() if s is not None)
    retried = sum(
        1
        for h in histories.values()
        if any(
            e.to_status is TaskStatus.PENDING and (e.reason or "").startswith("retry") for e in h
        )
    )
    report: dict[str, Any] = {
        "submitted": len(acked_tasks),
        "submit_attempts": len(submitted),
        "succeeded": statuses.get("succeeded", 0),
        "failed": statuses.get("failed", 0),
        "stopped": statuses.get("stopped", 0),
        "lost": statuses.get("lost", 0),
        "unfinished": sum(statuses.get(s, 0) for s in ("pending", "running", "paused")),
        "retried": retried,
        "starts": sum(sum(checkers.starts_per_attempt(h).values()) for h in histories.values()),
        "executions": sum(len(e) for e in checkers.parse_records(runs).values()),
        "fenced_effects": sum(len(e) for e in checkers.parse_records(effects).values()),
        "commands_sent": len(acked_commands),
        "commands_finished": sum(1 for c in commands.values() if c.get("f")),
        "command_outcomes": dict(Counter(c.get("o", "") for c in commands.values() if c.get("f"))),
        # the server-side command lease audit ({ns}:audit), replayed by check_command_leases
        "audit_claims": lease_audit.claims,
        "audit_completes": lease_audit.completes,
        "audit_releases": lease_audit.releases,
        "completions_without_lease": lease_audit.completions_without_lease,
    }
    for kind in VIOLATION_KINDS:
        report[kind] = counts.get(kind, 0)
    report["double_claims"] = counts.get("double_claims", 0)
    report["violation_examples"] = [vars(v) for v in found[:20]]
    return report


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _delete_namespace(url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    for pattern in ("{" + namespace + "}:*", f"stress:{namespace}:*"):
        for key in client.scan_iter(
            match=pattern.replace("{", "\\{").replace("}", "\\}")
            if pattern.startswith("{")
            else pattern,
            count=500,
        ):
            client.delete(key)
    client.close()


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"stress run, seed {report['seed']}: "
        f"{'[green]PASS[/]' if report['ok'] else '[red]FAIL[/]'}"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key in (
        "submitted",
        "succeeded",
        "failed",
        "stopped",
        "lost",
        "unfinished",
        "retried",
        "starts",
        "executions",
        "fenced_effects",
        "commands_sent",
        "commands_finished",
        "audit_claims",
        "audit_completes",
        "audit_releases",
        "completions_without_lease",
        "worker_processes_started",
        "seconds",
    ):
        table.add_row(key, str(report[key]))
    for key in VIOLATION_KINDS:
        value = report[key]
        table.add_row(f"violations: {key}", f"[red]{value}[/]" if value else "0")
    for kind, n in sorted(report["faults_scheduled"].items()):
        fired = report["faults_fired"].get(kind, 0)
        style = "" if fired >= n else "[red]"
        table.add_row(f"fault: {kind}", f"{style}{fired}/{n} fired")
    console = Console()
    console.print(table)
    for v in report["violation_examples"]:
        console.print(f"[red]{v['kind']}[/] {v['task_id']}: {v['detail']}", highlight=False)
