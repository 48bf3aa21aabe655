"""The contract has teeth: it fails every deliberately broken store and passes the reference.

Each store in ``tests/broken_stores.py`` and ``tests/broken_stores_round_two.py`` breaks one
promise. ``StoreContract`` is run
against it programmatically, the way pytest would (``setup_method``, the test, then
``teardown_method``), and at least one contract test must fail: first the test its rule names
(``CAUGHT_BY``) or one known to catch it (``tests/support/teeth_hints.py``), alone, and only if
that passes the whole contract (``contract_runner.caught_first``; each test runs
on a fresh store, so one that fails alone fails in the whole run too). The same runner reports
zero failures on ``InMemoryTaskStore`` (the whole contract), so a failure means the broken
behaviour, not the runner.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.testing.store_contract import StoreContract
from tests.broken_stores import BROKEN_STORES
from tests.broken_stores_review import CAUGHT_BY as REVIEW_CAUGHT_BY
from tests.broken_stores_review import REVIEW
from tests.broken_stores_round_two import CAUGHT_BY as ROUND_TWO_CAUGHT_BY
from tests.broken_stores_round_two import ROUND_TWO
from tests.support.contract_runner import caught_first, failures_of
from tests.support.teeth_hints import FIRST_CATCH

CONTRACT_TESTS = sorted(name for name in dir(StoreContract) if name.startswith("test_"))


def run_contract(factory: Callable[[], TaskStore]) -> dict[str, str]:
    """Run every contract test against stores from ``factory``; ``{test: why}`` per failure."""
    return failures_of(StoreContract, factory)


def test_the_contract_has_enough_tests_to_mean_something() -> None:
    assert len(CONTRACT_TESTS) >= 170


def test_the_runner_reports_no_failure_for_the_reference_store() -> None:
    assert run_contract(InMemoryTaskStore) == {}


def test_there_is_a_broken_store_for_every_pitfall() -> None:
    assert len(BROKEN_STORES) >= 170


@pytest.mark.parametrize("name", sorted(BROKEN_STORES))
def test_the_contract_fails_the_broken_store(name: str) -> None:
    first = CAUGHT_BY.get(name) or FIRST_CATCH.get(name)
    failures = caught_first(StoreContract, BROKEN_STORES[name], first)
    described = (BROKEN_STORES[name].__doc__ or "").strip()
    assert failures, f"{name} ({described}) passed the whole contract"
    caught = "\n".join(f"  {test}: {why}" for test, why in sorted(failures.items()))
    print(f"{name} ({described}) caught by {len(failures)} test(s):\n{caught}")


def test_the_contract_module_imports_no_test_framework() -> None:
    code = (
        "import sys, chongming_redis.testing.store_contract\n"
        "assert 'pytest' not in sys.modules and '_pytest' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


ROUND_TWO_STORES = {**ROUND_TWO, **REVIEW}
CAUGHT_BY = {**ROUND_TWO_CAUGHT_BY, **REVIEW_CAUGHT_BY}


def test_every_round_two_store_names_the_test_that_pins_its_rule() -> None:
    assert set(ROUND_TWO) == set(ROUND_TWO_CAUGHT_BY)
    assert set(REVIEW) == set(REVIEW_CAUGHT_BY)
    assert set(CAUGHT_BY.values()) <= set(CONTRACT_TESTS)
    assert set(ROUND_TWO_STORES) <= set(BROKEN_STORES)


@pytest.mark.parametrize("name", sorted(ROUND_TWO_STORES))
def test_the_rule_s_own_test_fails_the_round_two_store(name: str) -> None:
    failures = caught_first(StoreContract, ROUND_TWO_STORES[name], CAUGHT_BY[name])
    assert CAUGHT_BY[name] in failures, f"{name}: caught only by {sorted(failures)}"
