"""Acknowledged means replicated (``durability_replicas``), proven across a forced failover.

Real processes on loopback: a primary, its replica, three writer processes growing CAS chains
and logging every acknowledged version (``tests/support/failover.py``). The replica is made to
lag, the primary is killed with SIGKILL, the replica is promoted, a fresh replica joins it and
the writers go on; then every acknowledged version is checked against what the new primary
holds (RELIABILITY F14).

* Plain replication: the writers reach the primary through a proxy that is pointed at the
  replica once ``REPLICAOF NO ONE`` promoted it.
* Sentinel: three Sentinels watch the pair; the writers open the store with a
  ``redis+sentinel://`` URL and follow Sentinel's own failover (judged down after 0.5 s).

The lag: a partition of the replication link (its proxy blackholed: the stream is dropped), or
SIGSTOP of the replica (the stream waits in socket buffers the replica may still read before
it is promoted). With ``durability_replicas=1`` no acknowledged write may be lost, and writes
must be acknowledged again after the failover (the store found the new primary and loaded its
scripts there). The negative control, ``durability_replicas=0`` under a partition, must lose
acknowledged writes: the mechanism, not luck, is what keeps them. Each run prints its counts
(``docs/reliability.md`` quotes them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_redis.stress.fault_proxy import FaultProxy
from tests.support.failover import Outcome, run_failover
from tests.support.replicated_redis import Sentinels, start_primary, start_replica, wait_replicas

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]


class Pair:
    """A primary and a replica whose replication link runs through a proxy (``link``)."""

    def __init__(self) -> None:
        self.primary = start_primary()
        self.link = FaultProxy("127.0.0.1", self.primary.port)
        self.replica = start_replica(self.link.port)
        wait_replicas(self.primary, 1)

    def close(self) -> None:
        self.replica.close()
        self.link.close()
        self.primary.close()


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    request.getfixturevalue("redis_proc")  # skips, or fails in CI, without redis-server
    servers = Pair()
    yield servers
    servers.close()


def assert_outcome(outcome: Outcome, run: str, durability_replicas: int, partitioned: bool) -> None:
    print(f"\n{run}, durability_replicas={durability_replicas}: {outcome.line()}")
    assert outcome.acknowledged_after_failover > 0  # the store reached the new primary
    if durability_replicas:
        assert outcome.lost == 0, f"lost acknowledged writes: {outcome.examples}"
    elif partitioned:
        assert outcome.lost > 0, "the negative control lost nothing: the test has no teeth"


@pytest.mark.parametrize("lag", ["partition", "sigstop"])
@pytest.mark.parametrize("durability_replicas", [1, 0])
def test_plain_failover(
    pair: Pair, namespace: str, tmp_path: Path, durability_replicas: int, lag: str
) -> None:
    with FaultProxy("127.0.0.1", pair.primary.port) as writers_proxy:

        def promote() -> int:
            with pair.replica.client(socket_timeout=5) as client:
                client.replicaof("NO", "ONE")
            writers_proxy.set_upstream(pair.replica.port)
            writers_proxy.reset_all()
            return pair.replica.port

        outcome, fresh = run_failover(
            pair.primary, pair.replica, writers_proxy.url, namespace, tmp_path,
            durability_replicas=durability_replicas, promote=promote,
            partition=(lambda: pair.link.blackhole(True)) if lag == "partition" else None,
        )  # fmt: skip
        fresh.close()
    assert_outcome(outcome, f"plain, {lag}", durability_replicas, partitioned=lag == "partition")


@pytest.mark.parametrize("durability_replicas", [1, 0])
def test_sentinel_failover(
    pair: Pair, namespace: str, tmp_path: Path, durability_replicas: int
) -> None:
    sentinels = Sentinels(pair.primary.port, 3)
    try:
        outcome, fresh = run_failover(
            pair.primary, pair.replica, sentinels.url, namespace, tmp_path,
            durability_replicas=durability_replicas,
            promote=lambda: sentinels.wait_failover(pair.primary.port),
            partition=lambda: pair.link.blackhole(True),
        )  # fmt: skip
        fresh.close()
    except BaseException:
        print(sentinels.logs())
        raise
    finally:
        sentinels.close()
    assert_outcome(outcome, "sentinel, partition", durability_replicas, partitioned=True)
