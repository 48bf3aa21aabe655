"""``chongming-redis stress`` (or ``python -m chongming_redis.stress``): a stress run against
a real pool of worker processes (see ``chongming_redis.stress.harness``).

Exit status 0 only when every checker found nothing and every scheduled fault fired; 1 when
not; 2 when the run could not start (e.g. the namespace given already holds data).
"""

from __future__ import annotations

import argparse
import json
import sys

from redis import RedisError

from chongming_redis.embedded import EmbeddedRedisError
from chongming_redis.stress.harness import Options, StressError, render, run


def parse(argv: list[str] | None = None) -> tuple[Options, str | None]:
    p = argparse.ArgumentParser(
        prog="chongming-redis stress",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--redis",
        help="use this Redis (default: start a private redis-server with appendfsync always); "
        "the faults that need the private server are skipped and the report says so",
    )
    p.add_argument(
        "--namespace",
        help="an empty namespace for the run, deleted at the end unless --keep "
        "(default: stress-<seed>-<random>)",
    )
    p.add_argument("--workers", type=int, default=3, help="worker processes (K)")
    p.add_argument("--tasks", type=int, default=150, help="tasks to submit (N)")
    p.add_argument("--commands", type=int, default=None, help="stop/pause/resume (M)")
    p.add_argument("--seconds", type=float, default=20.0, help="load and fault window")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=4, help="task slots per worker")
    p.add_argument("--task-lease", type=float, default=2.0)
    p.add_argument("--drain-seconds", type=float, default=45.0)
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
    opts = Options(
        redis=a.redis,
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
    )
    return opts, a.json_file


def main(argv: list[str] | None = None) -> int:
    opts, json_file = parse(argv)
    try:
        report = run(opts)
    except (StressError, EmbeddedRedisError, RedisError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    render(report, stderr=json_file == "-")
    if json_file == "-":
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif json_file:
        with open(json_file, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
