"""What drawing a task id costs when the id must hash to a given bucket (``docs/scale-out.md``,
*Finding a task from its id*): the way a sharded namespace could find a keyed task's shard from
its id alone, weighed against an alias.

    .venv/bin/python -m bench.scale_out_ids

Per bucket count: µs per id drawn until ``BucketPolicy.bucket_for(id)`` is the wanted bucket
(ids as ``new_task`` makes them, ``secrets.token_hex(10)``), the draws per id, and a plain id's
cost beside it (measured in the same run). No assertions.
"""

from __future__ import annotations

import secrets
import time

from chongming_redis.runtime.buckets import BucketPolicy


def drawn_id(policy: BucketPolicy, bucket: int) -> tuple[str, int]:
    """An id in ``bucket``, and how many were drawn to find it."""
    draws = 0
    while True:
        draws += 1
        task_id = secrets.token_hex(10)
        if policy.bucket_for(task_id) == bucket:
            return task_id, draws


def main() -> None:
    count = 2000
    started = time.perf_counter()
    for _ in range(count):
        secrets.token_hex(10)
    plain = (time.perf_counter() - started) / count * 1e6
    print(f"a plain id (secrets.token_hex(10)): {plain:.2f} µs")
    for buckets in (16, 64, 256):
        policy = BucketPolicy(buckets)
        started, draws = time.perf_counter(), 0
        for i in range(count):
            draws += drawn_id(policy, i % buckets)[1]
        seconds = time.perf_counter() - started
        print(
            f"{buckets:>4} buckets: {seconds / count * 1e6:7.1f} µs per id drawn into a given "
            f"bucket ({draws / count:.0f} draws; {seconds / count * 1e6 / plain:,.0f}× a plain id)"
        )


if __name__ == "__main__":
    main()
