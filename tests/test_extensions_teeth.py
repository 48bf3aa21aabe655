"""``ExtensionsContract`` has teeth: it fails every deliberately broken extension store and
passes the reference.

Each store in ``tests/broken_extension_stores.py`` breaks one rule of ``stores/extensions.py``
(those of ``tests/broken_dependency_stores.py`` one duty of ``DependenciesStore``, those of
``tests/broken_task_schema_stores.py`` one of ``TaskSchemasStore``, merged here).
``ExtensionsContract`` is run against it programmatically, the way pytest would
(``setup_method``, the test, then ``teardown_method``), with the reference's
``expected_extensions``; the test ``CAUGHT_BY`` names must fail. That test runs alone first, and
the whole contract only if it passes (``contract_runner.caught_first``; each test
runs on a fresh store, so one that fails alone fails in the whole run too). The same runner
reports zero failures on ``InMemoryTaskStore`` and on the sound rebuilds the broken stores start
from (the whole contract), so a failure means the broken behaviour, not the runner.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

import pytest

from chongming_redis.model import TaskSnapshot
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.testing.extensions_contract import ExtensionsContract
from tests import broken_commit_start_stores, broken_dependency_stores, broken_task_schema_stores
from tests.broken_extension_stores import BROKEN_EXTENSION_STORES, CAUGHT_BY, SOUND
from tests.broken_extension_stores import EXPECTED as EXPECTED_BEFORE_DEPENDENCIES
from tests.support.contract_runner import caught_first, failures_of
from tests.support.redis_server import RedisProc
from tests.test_extensions_contract import REDIS

CONTRACT_TESTS = sorted(name for name in dir(ExtensionsContract) if name.startswith("test_"))

# The dependencies' broken stores, in their own module too; the reference implements the
# extension, so it is declared with the others.
CAUGHT_BY.update(broken_dependency_stores.CAUGHT_BY)
BROKEN_EXTENSION_STORES.update(broken_dependency_stores.BROKEN)
SOUND.update(broken_dependency_stores.SOUND)
# The parameter schemas' broken stores, likewise; and commit_and_start's.
CAUGHT_BY.update(broken_task_schema_stores.CAUGHT_BY)
BROKEN_EXTENSION_STORES.update(broken_task_schema_stores.BROKEN)
SOUND.update(broken_task_schema_stores.SOUND)
CAUGHT_BY.update(broken_commit_start_stores.CAUGHT_BY)
BROKEN_EXTENSION_STORES.update(broken_commit_start_stores.BROKEN)
SOUND.update(broken_commit_start_stores.SOUND)
EXPECTED = EXPECTED_BEFORE_DEPENDENCIES | {
    broken_dependency_stores.EXTENSION,
    broken_task_schema_stores.EXTENSION,
    broken_commit_start_stores.EXTENSION,
}


def run_contract(
    factory: Callable[[], TaskStore], expected: frozenset[str] = EXPECTED
) -> dict[str, str]:
    """Run every extensions test against stores from ``factory``; ``{test: why}`` per failure."""
    return failures_of(ExtensionsContract, factory, expected_extensions=expected)


def test_the_contract_has_enough_tests_to_mean_something() -> None:
    assert len(CONTRACT_TESTS) >= 21


@pytest.mark.parametrize("name", sorted(SOUND))
def test_the_runner_reports_no_failure_for_the_reference_and_the_sound_rebuilds(
    name: str,
) -> None:
    assert run_contract(SOUND[name]) == {}


def test_there_are_enough_broken_stores_and_each_names_its_test() -> None:
    assert len(BROKEN_EXTENSION_STORES) >= 15
    assert set(BROKEN_EXTENSION_STORES) == set(CAUGHT_BY)
    assert set(CAUGHT_BY.values()) <= set(CONTRACT_TESTS)


def test_every_test_the_reference_runs_pins_a_broken_store() -> None:
    """Only the Redis-only extensions (the bucket pool, its recorded count, the nudges and the
    worker beats), which the in-memory reference does not implement, have no broken store
    here; the work nudge and the beats are pinned by broken Redis stores below."""
    redis_only = {
        "test_pool_ticks_take_free_buckets_and_never_give_one_two_owners",
        "test_a_pool_tick_with_another_num_buckets_is_refused_and_writes_nothing",
        "test_the_nudge_channel_names_a_namespace_and_a_client",
        "test_a_store_that_publishes_work_does_so_for_each_create_and_only_then",
        "test_recorded_num_buckets_is_what_the_first_pool_member_recorded",
        BEATS_TEST,
    }
    assert set(CONTRACT_TESTS) - set(CAUGHT_BY.values()) == redis_only


@pytest.mark.parametrize("name", sorted(BROKEN_EXTENSION_STORES))
def test_the_contract_fails_the_broken_store(name: str) -> None:
    store = BROKEN_EXTENSION_STORES[name]
    failures = caught_first(
        ExtensionsContract, store, CAUGHT_BY[name], expected_extensions=EXPECTED
    )
    described = (store.__doc__ or "").strip()
    assert failures, f"{name} ({described}) passed the whole extensions contract"
    assert CAUGHT_BY[name] in failures, f"{name}: caught only by {sorted(failures)}"
    caught = "\n".join(f"  {test}: {why}" for test, why in sorted(failures.items()))
    print(f"{name} ({described}) caught by {len(failures)} test(s):\n{caught}")


def test_the_extensions_contract_module_imports_no_test_framework() -> None:
    code = (
        "import sys, chongming_redis.testing.extensions_contract\n"
        "assert 'pytest' not in sys.modules and '_pytest' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the nudge a Redis store publishes itself ----------------------------------------------------


NUDGE_TEST = "test_a_store_that_publishes_work_does_so_for_each_create_and_only_then"


class NudgesAnotherNamespace(RedisTaskStore):
    """Says it publishes the work nudge, but names another namespace than its scripts use:
    workers listening where it says never hear of new tasks."""

    @property
    def namespace(self) -> str:
        return super().namespace + "-elsewhere"


class NudgesOnEverySave(RedisTaskStore):
    """Publishes the work nudge on saves too: every worker wakes for nothing."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        super().save(snapshot, expect_version=expect_version)
        self.client.publish("{" + self.namespace + "}:nudge:work", b"1")


@pytest.mark.redis
@pytest.mark.parametrize("broken", [NudgesAnotherNamespace, NudgesOnEverySave])
def test_the_work_nudge_test_fails_a_redis_store_that_breaks_it(
    redis_proc: RedisProc, broken: type[RedisTaskStore]
) -> None:
    def make() -> TaskStore:
        return broken.from_url(redis_proc.url, namespace=f"nudge-{uuid.uuid4().hex[:8]}")

    failures = failures_of(ExtensionsContract, make, expected_extensions=REDIS)
    assert set(failures) == {
        "test_a_store_that_publishes_work_does_so_for_each_create_and_only_then"
    }


@pytest.mark.redis
def test_the_work_nudge_test_passes_the_redis_store(redis_proc: RedisProc) -> None:
    def make() -> TaskStore:
        return RedisTaskStore.from_url(redis_proc.url, namespace=f"nudge-{uuid.uuid4().hex[:8]}")

    assert failures_of(ExtensionsContract, make, expected_extensions=REDIS) == {}


# -- the worker beats (Redis only: the in-memory store has no pool) ------------------------------


BEATS_TEST = "test_worker_beats_follow_join_tick_leave_and_expiry"


class BeatsAreTheExpiry(RedisTaskStore):
    """Gives each worker's heartbeat expiry (what pool_state has) instead of its last tick:
    every heartbeat looks a lease younger than it is."""

    def worker_beats(self) -> dict[str, datetime]:
        return self.pool_state()[0]


class _KeepsBeats(RedisTaskStore):
    """Puts back, after each tick, the beats of the workers ``dropped`` names: the hash then
    holds workers ``{ns}:workers`` no longer does (pool_tick.lua without one of its HDELs)."""

    def pool_tick(
        self,
        *,
        worker: str,
        now: datetime,
        lease_seconds: float,
        num_buckets: int,
        wanted: Sequence[int],
        leaving: bool = False,
    ) -> tuple[list[int], list[str]]:
        before = self.worker_beats()
        result = super().pool_tick(
            worker=worker, now=now, lease_seconds=lease_seconds, num_buckets=num_buckets,
            wanted=wanted, leaving=leaving,
        )  # fmt: skip
        gone = set(before) - set(self.worker_beats())
        for name in self.dropped(gone, worker, leaving):
            self.client.hset(self.keys.worker_beats, name, encode_dt(before[name]) // 1000)
        return result

    def dropped(self, gone: set[str], worker: str, leaving: bool) -> set[str]:
        raise NotImplementedError


class BeatsStayAfterLeaving(_KeepsBeats):
    """A worker that leaves keeps its beat."""

    def dropped(self, gone: set[str], worker: str, leaving: bool) -> set[str]:
        return gone & {worker} if leaving else set()


class BeatsStayAfterExpiry(_KeepsBeats):
    """A worker dropped as expired keeps its beat."""

    def dropped(self, gone: set[str], worker: str, leaving: bool) -> set[str]:
        return gone - {worker}


@pytest.mark.redis
@pytest.mark.parametrize("broken", [BeatsAreTheExpiry, BeatsStayAfterLeaving, BeatsStayAfterExpiry])
def test_the_worker_beats_test_fails_a_redis_store_that_breaks_it(
    redis_proc: RedisProc, broken: type[RedisTaskStore]
) -> None:
    def make() -> TaskStore:
        return broken.from_url(redis_proc.url, namespace=f"beats-{uuid.uuid4().hex[:8]}")

    failures = failures_of(ExtensionsContract, make, expected_extensions=REDIS)
    assert set(failures) == {BEATS_TEST}, failures
