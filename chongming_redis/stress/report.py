"""The stress run's report: the ground truth read back from the store (the store's methods, and
``ground_truth`` for the records only one kind of store keeps), the checkers run over it, the
verdict, and the table ``render`` prints. ``harness.run`` calls ``collect`` once the run is
drained and adds what only it knows (faults, processes, timings)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.runtime import scheduling
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.stress import app as stress_app
from chongming_redis.stress import (
    checkers,
    dependency_checks,
    feed_watch,
    lease_audit,
    limit_checks,
    lin_report,
    policy_report,
    schedule_checks,
    start_checks,
)
from chongming_redis.stress.ground_truth import GroundTruth
from chongming_redis.stress.policy_report import PolicyRun
from chongming_redis.stress.stress_store import StressStore

VIOLATION_KINDS = (
    "duplicate_starts",
    "duplicate_completions",
    "double_claims",
    "duplicate_executions",
    "cas_chain",
    "history_gaps",
    "acked_writes_lost",
    "command_state",
    "command_holder",
    "early_starts",
    "slots_exceeded",
    "idle_slot_waits",
    "start_order",
    # the task policies (stress/policy_checks.py)
    "attempts_exceeded",
    "timeout_overrun",
    "removed_early",
    "unique_duplicates",
    "unique_orphans",
    # the limits (stress/limit_checks.py)
    "limit_overruns",
    "stale_holders",
    "rate_overruns",
    # the schedules (stress/schedule_checks.py)
    "tick_double_fires",
    "tick_gaps",
    "early_ticks",
    # the dependencies (stress/dependency_checks.py)
    "early_releases",
    "wrong_releases",
    "waiting_exits",
    "stuck_waiting",
    # the linearizability check (stress/lin_report.py): per task and per command
    "not_linearizable",
)

#: The workers' start interval (``ControllerConfig.start_poll_interval``, the CLI's default).
START_INTERVAL = ControllerConfig().start_poll_interval


def verdict(report: dict[str, Any]) -> bool:
    """A run passes with no violation, every scheduled fault fired, and some progress: a run
    whose every task failed (a broken app, a store that refuses each step) proves nothing,
    however clean its records are."""
    no_progress = report["submitted"] > 0 and report["succeeded"] == 0
    return report["violations"] == 0 and not report["faults_missing"] and not no_progress


def collect(
    store: StressStore,
    truth: GroundTruth,
    submitted: list[str],
    acked_tasks: list[str],
    acked_commands: list[str],
    slots: int,
    *,
    policies: PolicyRun,
    quiet: Callable[[float, float], bool] = lambda since, until: True,
    graphs: dependency_checks.Edges | None = None,
    oplog_dir: Path | None = None,
) -> dict[str, Any]:
    """Read the ground truth from the store and run every checker (``slots``: each worker's;
    ``policies``: the workers' policy settings and the feed watch). A task its retention
    removed is judged on what the feed watch kept of it (its final snapshot and history),
    and counts as present (not lost) by its tombstone. ``oplog_dir``: the run's operation
    logs, checked for linearizability (``lin_report``)."""
    run = policies
    finals: dict[str, TaskSnapshot | None] = {t: store.get(t) for t in submitted}
    tombstones = feed_watch.tombstones(store)
    gone = policy_report.removed(finals, tombstones, run.watch)
    known: dict[str, TaskSnapshot | None] = {**finals, **gone.snapshots}
    histories: dict[str, list[Transition]] = {
        t: store.history(t) for t, snap in finals.items() if snap is not None
    }
    histories.update(gone.histories)
    present: dict[str, object | None] = {**known, **gone.tombstones}
    runs = truth.runs()
    effects = truth.effects()
    commands = truth.commands(acked_commands)
    queued, leased = truth.command_indexes()
    lease_audit = truth.lease_audit()  # None: the store keeps no audit (skipped_checks)

    found = (
        checkers.check_starts(histories)
        + checkers.check_completions(histories)
        + checkers.check_cas_chain(histories, known)
        + checkers.check_executions(runs, effects, histories, unknown=gone.unverifiable)
        + checkers.check_durability(acked_tasks, present, "task")
        + checkers.check_durability(acked_commands, commands, "command")
        + checkers.check_commands(commands, queued, leased)
        + start_checks.check_not_before(histories, known)
        + start_checks.check_slots(histories, slots)
        + start_checks.check_work_conservation(histories, known, slots, START_INTERVAL, quiet)
        + start_checks.check_start_order(histories, known, quiet=quiet)
        + (lease_audit.violations if lease_audit is not None else [])
    )
    policy_found, policy_counts = policy_report.check(store, known, histories, tombstones, run)
    found += policy_found
    limit_found, limit_counts = check_limits(store, truth, known, histories)
    found += limit_found
    beat = scheduling.read(store, stress_app.BEAT.id)  # the state first, then its tasks
    # In a soak the tick tasks' retention removes them while it runs: those count by what the
    # feed watch saw of them.
    ticks = store.query(TaskQuery(name=stress_app.BEAT.task))
    if run.watch is not None:
        present_ticks = {t.task_id for t in ticks}
        ticks += [seen.last for task_id, seen in run.watch.tasks.items()
                  if task_id in run.watch.removed_by and task_id not in present_ticks
                  and seen.last.name == stress_app.BEAT.task]  # fmt: skip
    tick_found, tick_counts = schedule_checks.check_schedule(
        None if beat is None else beat.state, ticks
    )
    found += tick_found
    graph_found, graph_counts = dependency_checks.check_graphs(graphs or {}, known, histories)
    found += graph_found
    linearizability = lin_report.check(oplog_dir, histories, finals, store)
    found += lin_report.violations(linearizability)
    counts = checkers.count(found)
    statuses = Counter(s.status.value for s in known.values() if s is not None)
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
        "unfinished": sum(statuses.get(s, 0) for s in ("waiting", "pending", "running", "paused")),
        # why tasks failed (the step never fails by itself: each is a store or worker error)
        "failure_types": failure_types(known),
        "retried": retried,
        "starts": sum(sum(checkers.starts_per_attempt(h).values()) for h in histories.values()),
        "executions": sum(len(e) for e in checkers.parse_records(runs).values()),
        "fenced_effects": sum(len(e) for e in checkers.parse_records(effects).values()),
        "commands_sent": len(acked_commands),
        "commands_finished": sum(1 for c in commands.values() if c.get("f")),
        "command_outcomes": dict(Counter(c.get("o", "") for c in commands.values() if c.get("f"))),
        "commands_unfinished": unfinished_commands(commands, leased),
        **audit_counts(lease_audit),
        "checks_skipped": dict(truth.skipped_checks),
        # acknowledged tasks their retention removed (counted above by their final status)
        "removed": len(gone.tombstones),
        "removed_unwatched": len(gone.unverifiable),
        **policy_counts,
        **limit_counts,
        **tick_counts,
        **graph_counts,
    }
    if linearizability is not None:
        report["linearizability"] = linearizability
    for kind in VIOLATION_KINDS:
        report[kind] = counts.get(kind, 0)
    report["double_claims"] = counts.get("double_claims", 0)
    report["violation_examples"] = [vars(v) for v in found[:20]]
    return report


def audit_counts(lease_audit: lease_audit.LeaseAudit | None) -> dict[str, int]:
    """The server-side command lease audit ({ns}:audit), replayed by
    ``audit_command_leases``; none where the store keeps no audit."""
    if lease_audit is None:
        return {}
    return {
        "audit_claims": lease_audit.claims,
        "audit_completes": lease_audit.completes,
        "audit_releases": lease_audit.releases,
        "completions_without_lease": lease_audit.completions_without_lease,
    }


def check_limits(
    store: StressStore,
    truth: GroundTruth,
    known: dict[str, TaskSnapshot | None],
    histories: dict[str, list[Transition]],
) -> tuple[list[checkers.Violation], dict[str, Any]]:
    """The limits' checkers (``limit_checks``) against the app's own definitions (what the
    types ask for, whatever the workers recorded), the began records and the holder sets
    (``{ns}:lh:<ref>``, ``limit_holders``) as they are now: the run is quiet, nothing writes."""
    definitions = limit_checks.Definitions.parse(stress_app.app.limit_definitions()[0])
    began = limit_checks.parse_began(truth.began())
    result = limit_checks.check_concurrency(histories, known, began, definitions)
    limit_checks.check_rates(histories, known, began, definitions, result=result)
    holders = truth.limit_holders()
    tasks = dict(known)
    named: set[str] = set().union(*holders.values())
    for task_id in named - set(tasks):
        tasks[task_id] = store.get(task_id)
    found = result.violations + limit_checks.check_holders(holders, tasks, definitions)
    limited = [s for s in known.values() if s is not None and s.limits]
    return found, {
        "limited_tasks": len(limited),
        # per limit id: the most of one ref certainly holding at once / starts over the bound
        "limit_peaks": result.peaks,
        "rate_peaks": result.rate_peaks,
        "limit_unjudged": result.unjudged,
        "limit_holders_at_end": sum(len(m) for m in holders.values()),
    }


def unfinished_commands(
    commands: dict[str, dict[str, str]], leased: list[str]
) -> list[dict[str, str]]:
    """The acknowledged commands still unfinished when the workers stopped: each with its task,
    its kind and where it was, ``leased`` (a claim held it, lease end ``lu`` in µs) or
    ``queued`` (claimable): the drain waits for the tasks, not for the commands."""
    held = set(leased)
    return [
        {
            "cid": cid,
            "task": fields.get("t", ""),
            "kind": fields.get("k", ""),
            "where": "leased" if cid in held else "queued",
            "lu": fields.get("lu", ""),
        }
        for cid, fields in sorted(commands.items())
        if fields and not fields.get("f")
    ]


def failure_types(finals: dict[str, TaskSnapshot | None]) -> dict[str, int]:
    """How many tasks ended FAILED, by failure type."""
    failed = [s for s in finals.values() if s is not None and s.status is TaskStatus.FAILED]
    return dict(Counter(s.failure.error_type if s.failure else "?" for s in failed))


def render(report: dict[str, Any], *, stderr: bool = False) -> None:
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
        # the task policies
        "retries_by_cause",
        "timeouts",
        "timeouts_enforced",
        "timeout_worst_overrun",
        "expired",
        "expiry_lag_max",
        "unique_submits",
        "unique_created",
        "unique_returned_holder",
        "policy_bounds",
        # the limits
        "limited_tasks",
        "limit_peaks",
        "rate_peaks",
        "limit_unjudged",
    ):
        table.add_row(key, str(report.get(key, "-")))
    for key, value in lin_report.rows(report.get("linearizability")):
        table.add_row(key, value)
    for key in VIOLATION_KINDS:
        value = report.get(key, 0)
        table.add_row(f"violations: {key}", f"[red]{value}[/]" if value else "0")
    for kind, n in sorted(report["faults_scheduled"].items()):
        fired = report["faults_fired"].get(kind, 0)
        style = "" if fired >= n else "[red]"
        table.add_row(f"fault: {kind}", f"{style}{fired}/{n} fired")
    for kind, why in sorted(report.get("faults_skipped", {}).items()):
        table.add_row(f"skipped: {kind}", why)
    for check, why in sorted(report.get("checks_skipped", {}).items()):
        table.add_row(f"check skipped: {check}", why)
    console = Console(stderr=stderr)
    console.print(table)
    for v in report["violation_examples"]:
        console.print(f"[red]{v['kind']}[/] {v['task_id']}: {v['detail']}", highlight=False)
