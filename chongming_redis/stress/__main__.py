"""``chongming-redis stress`` (or ``python -m chongming_redis.stress``): a stress run against
a real pool of worker processes (see ``chongming_redis.stress.harness``).

Exit status 0 only when every checker found nothing and every scheduled fault fired; 1 when
not, and for a mistake on the command line (one ``error:`` line, as every command prints it;
nothing is run); 2 when the run could not start (e.g. the namespace given already holds data).

``--seeds A..B`` runs one stress run per seed A, A+1, ..., B, one after the other, and prints
one summary line per seed (seed, tasks, violations, faults fired/scheduled); the exit status is
0 only when every seed passed (2 when a run could not start, else 1 when one failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from redis import RedisError
from redis.exceptions import RedisClusterException

from chongming_redis.embedded.redis_server import EmbeddedRedisError
from chongming_redis.errors import MissingExtra, StoreError
from chongming_redis.stores.urls import StoreUrlError, parse_store_url
from chongming_redis.stress import lin_report
from chongming_redis.stress.harness import Options, run
from chongming_redis.stress.namespace import StressError
from chongming_redis.stress.report import VIOLATION_KINDS, render
from chongming_redis.stress.soak import RATE, SoakPlan
from chongming_redis.stress.soak import render as render_soak
from chongming_redis.stress.sql_records import SqlRecordsError
from chongming_redis.stress.targets import check_new_sqlite

#: A run that could not start or go on (exit status 2): the namespace given holds data, no
#: server, the server or the cluster refused or is unreachable.
CANNOT_RUN = (StressError, EmbeddedRedisError, RedisError, RedisClusterException, StoreError,
              SqlRecordsError)  # fmt: skip


#: ``--help``'s description: plain text (the module docstring is for readers of the code).
DESCRIPTION = """\
A stress run against a real pool of worker processes under faults (worker SIGKILL and SIGSTOP,
clock skew, Redis kill -9 and restart, dropped connections), then checkers that read the stored
histories: exactly-once starts, no lost acknowledged write, the policies, limits, schedules and
dependencies, and that every recorded store call is linearizable (docs/reliability.md). On
Redis by default; --store runs it on SQLite or PostgreSQL, with the faults that apply to that
store (the report lists the others as skipped).

Exit status: 0 when every checker found nothing and every scheduled fault fired; 1 when not, or
for a mistake on the command line; 2 when the run could not start (the namespace holds data, no
server). --seeds A..B runs one run per seed and prints one summary line each."""
EXAMPLE = ("example: chongming-redis stress --workers 3 --tasks 150 --seconds 20 --seed 1 "
           "--json report.json")  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """A mistake is one ``error:`` line and exit status 1, as on every other command."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"error: {message} (see: chongming-redis stress --help)\n")


def _at_least(minimum: float, kind: type = int) -> Any:
    def check(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {text}")
        return value

    return check


def parse(argv: list[str] | None = None) -> tuple[Options, str | None, list[int] | None]:
    p = _Parser(
        prog="chongming-redis stress",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"{invariants()}\n\n{EXAMPLE}",
    )
    p.add_argument(
        "--redis",
        help="use this Redis (default: start a private redis-server with appendfsync always); "
        "the faults that need the private server are skipped and the report says so",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="--redis names a node of a Redis Cluster (the proxy's faults are skipped)",
    )
    p.add_argument(
        "--store",
        type=store_option,
        metavar="URL",
        help="run on a SQL store instead of Redis: sqlite:///abs/new-file.sqlite3, sqlite (a new "
        "file in the run's directory), postgresql://... (a new schema there), or postgresql "
        "(a private server the run starts, so it can kill -9 it)",
    )
    p.add_argument(
        "--namespace",
        help="an empty namespace for the run, deleted at the end unless --keep "
        "(default: stress-<seed>-<random>)",
    )
    p.add_argument("--workers", type=_at_least(1), default=3, help="worker processes (K)")
    p.add_argument("--tasks", type=_at_least(1), default=150, help="tasks to submit (N)")
    p.add_argument("--commands", type=_at_least(0), default=None, help="stop/pause/resume (M)")
    p.add_argument("--seconds", type=_at_least(1, float), default=20.0,
                   help="load and fault window")  # fmt: skip
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=1)
    seeds.add_argument(
        "--seeds",
        type=seed_range,
        metavar="A..B",
        help="a matrix: one run per seed from A to B (inclusive), one summary line each",
    )
    p.add_argument(
        "--soak",
        type=_at_least(0.5, float),
        metavar="MINUTES",
        help="a soak on Redis: load at --soak-rate, faults and removal for MINUTES, "
        "Redis memory per stored task sampled (replaces --seconds and --tasks)",
    )
    p.add_argument(
        "--soak-rate",
        type=_at_least(0.1, float),
        default=RATE,
        help="workload submits per second in a soak",
    )
    p.add_argument("--concurrency", type=_at_least(1), default=4, help="task slots per worker")
    p.add_argument("--task-lease", type=_at_least(0.5, float), default=2.0)
    p.add_argument("--drain-seconds", type=_at_least(1, float), default=45.0)
    p.add_argument("--keep", action="store_true", help="leave the data, logs and AOF")
    p.add_argument("--workdir", help="where logs go (default: a temporary directory)")
    p.add_argument(
        "--json",
        dest="json_file",
        metavar="FILE",
        nargs="?",
        const="-",
        help="write the report as JSON to FILE, or to stdout without FILE "
        "(the table then goes to stderr)",
    )
    a = p.parse_args(argv)
    if a.store is not None and (a.redis is not None or a.cluster):
        p.error("--store names the store: give it without --redis and --cluster")
    soak = None
    if a.soak is not None:
        if a.store is not None or a.cluster or a.seeds is not None:
            p.error("--soak runs on Redis, one seed: give it without --store, --cluster, --seeds")
        soak = SoakPlan.for_minutes(a.soak, a.soak_rate)
        a.seconds, a.tasks = soak.seconds, soak.tasks
    opts = Options(
        store=a.store,
        redis=a.redis,
        cluster=a.cluster,
        namespace=a.namespace,
        workers=a.workers,
        tasks=a.tasks,
        commands=a.commands,
        seconds=a.seconds,
        seed=a.seed,
        keep=a.keep,
        concurrency=a.concurrency,
        task_lease=a.task_lease,
        worker_lease=a.task_lease,
        drain_seconds=a.drain_seconds,
        workdir=a.workdir,
        soak=soak,
    )
    return opts, a.json_file, a.seeds


def store_option(text: str) -> str:
    """``--store``: ``sqlite`` or ``postgresql`` alone, or a SQLite or PostgreSQL URL that can
    be used: a SQLite file that does not exist yet in a directory that does, a PostgreSQL with
    its extra installed. Judged before anything starts (exit status 1)."""
    if text in ("sqlite", "postgresql"):
        return text
    try:
        target = parse_store_url(text)
        if target.kind == "redis":
            raise StoreUrlError(
                "a Redis is given with --redis URL; --store takes sqlite:///path, sqlite, "
                "postgresql://... or postgresql"
            )
        if target.kind == "sqlite":
            check_new_sqlite(Path(target.path or ""))
        target.check_driver()
    except (StoreUrlError, StressError, MissingExtra) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def invariants() -> str:
    """The ``--help`` epilog: the invariants every run checks (``report.VIOLATION_KINDS``,
    the report's ``violations: <kind>`` rows; docs/reliability.md)."""
    lines, line = [], " "
    for kind in VIOLATION_KINDS:
        if len(line) + len(kind) > 88:
            lines.append(line)
            line = " "
        line += f" {kind},"
    lines.append(line.rstrip(","))
    return "invariants checked on every run (any violation fails it):\n" + "\n".join(lines)


def seed_range(text: str) -> list[int]:
    first, sep, last = text.partition("..")
    try:
        seeds = list(range(int(first), int(last) + 1)) if sep else []
    except ValueError:
        seeds = []
    if not seeds:
        raise argparse.ArgumentTypeError(f"expected A..B with A <= B, not {text!r}")
    return seeds


def summary(report: dict[str, Any]) -> str:
    """One line for a run of the matrix."""
    scheduled = sum(report["faults_scheduled"].values())
    fired = sum(
        min(n, report["faults_fired"].get(k, 0)) for k, n in report["faults_scheduled"].items()
    )
    line = (
        f"seed {report['seed']:>4}: {'PASS' if report['ok'] else 'FAIL'}  "
        f"tasks {report['submitted']} (succeeded {report['succeeded']}, "
        f"stopped {report['stopped']}, failed {report['failed']}, lost {report['lost']}, "
        f"unfinished {report['unfinished']})  violations {report['violations']}  "
        f"faults {fired}/{scheduled} fired  {report['seconds']}s  "
        f"{lin_report.summary(report.get('linearizability'))}"
    )
    if "unique_submits" in report:  # the task policies really in use
        retries = sum(report.get("retries_by_cause", {}).values())
        line += (f"  policies: retries {retries}, timeouts {report['timeouts']}, expired "
                 f"{report['expired']}, unique {report['unique_created']}/"
                 f"{report['unique_submits']} created")  # fmt: skip
    bad = {k: report[k] for k in VIOLATION_KINDS if report.get(k)}
    if bad:
        line += "  " + " ".join(f"{k}={n}" for k, n in bad.items())
    if report["submitted"] and not report["succeeded"]:
        line += "  no task succeeded"
    if report.get("failure_types"):
        line += "  failures " + " ".join(f"{k}={n}" for k, n in report["failure_types"].items())
    if report["faults_missing"]:
        line += "  missing " + " ".join(f"{k}={n}" for k, n in report["faults_missing"].items())
    return line


def matrix(opts: Options, seeds: list[int], json_file: str | None) -> int:
    out = sys.stderr if json_file == "-" else sys.stdout
    reports: list[dict[str, Any]] = []
    status = 0
    for seed in seeds:
        one = dataclasses.replace(
            opts,
            seed=seed,
            namespace=f"{opts.namespace}-{seed}" if opts.namespace else None,
            workdir=str(Path(opts.workdir) / f"seed-{seed}") if opts.workdir else None,
        )
        try:
            report = run(one)
        except CANNOT_RUN as exc:
            print(f"seed {seed:>4}: ERROR  {exc}", file=out, flush=True)
            status = 2
            continue
        reports.append(report)
        print(summary(report), file=out, flush=True)
        if not report["ok"] and status == 0:
            status = 1
    passed = sum(1 for r in reports if r["ok"])
    print(
        f"{len(seeds)} seeds: {passed} passed, {len(seeds) - passed} failed; "
        f"violations {sum(r['violations'] for r in reports)}, faults "
        f"{sum(sum(r['faults_fired'].values()) for r in reports)}/"
        f"{sum(sum(r['faults_scheduled'].values()) for r in reports)} fired",
        file=out,
        flush=True,
    )
    _write_json(reports, json_file)
    return status


def _write_json(data: Any, json_file: str | None) -> None:
    if json_file == "-":
        json.dump(data, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif json_file:
        with open(json_file, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")


def main(argv: list[str] | None = None) -> int:
    opts, json_file, seeds = parse(argv)
    if seeds is not None:
        return matrix(opts, seeds, json_file)
    try:
        report = run(opts)
    except CANNOT_RUN as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    render(report, stderr=json_file == "-")
    if "soak" in report:
        render_soak(report["soak"], sys.stderr if json_file == "-" else sys.stdout)
    _write_json(report, json_file)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
