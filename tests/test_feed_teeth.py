"""``FeedContract`` has teeth: it fails every deliberately broken change feed and passes the
reference.

Each store in ``tests/broken_feeds.py`` breaks one rule of ``ChangeFeed``
(``stores/protocol.py``). ``FeedContract`` is run against it programmatically, the
way pytest would (``setup_method``, the test, then ``teardown_method``); the test ``CAUGHT_BY``
names must fail. That test runs alone first, and the whole contract only if it passes
(``contract_runner.caught_first``; each test runs on a fresh store). The same
runner reports zero failures on
``InMemoryTaskStore`` and on the sound rebuild the swapped feeds start from, so a failure means
the broken behaviour, not the runner.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from chongming_redis.stores.protocol import TaskStore
from chongming_redis.testing.feed_contract import FeedContract
from tests.broken_feeds import BROKEN_FEEDS, CAUGHT_BY, SOUND
from tests.support.contract_runner import caught_first, failures_of

CONTRACT_TESTS = sorted(name for name in dir(FeedContract) if name.startswith("test_"))


def run_contract(factory: Callable[[], TaskStore]) -> dict[str, str]:
    """Run every feed test against stores from ``factory``; ``{test: why}`` per failure."""
    return failures_of(FeedContract, factory)


def test_the_contract_has_enough_tests_to_mean_something() -> None:
    assert len(CONTRACT_TESTS) >= 25


@pytest.mark.parametrize("name", sorted(SOUND))
def test_the_runner_reports_no_failure_for_the_reference_and_the_sound_rebuild(
    name: str,
) -> None:
    assert run_contract(SOUND[name]) == {}


def test_there_are_enough_broken_feeds_and_each_names_its_test() -> None:
    assert len(BROKEN_FEEDS) >= 18
    assert set(BROKEN_FEEDS) == set(CAUGHT_BY)
    assert set(CAUGHT_BY.values()) <= set(CONTRACT_TESTS)


def test_every_contract_test_pins_a_broken_feed() -> None:
    assert set(CONTRACT_TESTS) == set(CAUGHT_BY.values())


@pytest.mark.parametrize("name", sorted(BROKEN_FEEDS))
def test_the_rule_s_own_test_fails_the_broken_feed(name: str) -> None:
    failures = caught_first(FeedContract, BROKEN_FEEDS[name], CAUGHT_BY[name])
    described = " ".join((BROKEN_FEEDS[name].__doc__ or "").split())
    assert CAUGHT_BY[name] in failures, f"{name} ({described}): caught only by {sorted(failures)}"


def test_the_contract_module_imports_no_test_framework() -> None:
    code = (
        "import sys, chongming_redis.testing.feed_contract\n"
        "assert 'pytest' not in sys.modules and '_pytest' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
