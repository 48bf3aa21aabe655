"""Running a shipped contract suite programmatically, the way pytest would (``setup_method``,
the test, ``teardown_method``), to prove its teeth on deliberately broken stores."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from chongming_redis.stores.protocol import TaskStore
from chongming_redis.testing.contract.support import ContractBase

#: Set (``CHONGMING_TEETH_WHOLE=1``) to run the whole contract on every broken store, as the
#: teeth tests did before they ran the catching test first: each then prints every test that
#: catches its store (``pytest -s``). The verdicts are the same either way.
WHOLE = bool(os.environ.get("CHONGMING_TEETH_WHOLE"))


def test_names(contract: type[ContractBase]) -> list[str]:
    return sorted(name for name in dir(contract) if name.startswith("test_"))


def failures_of(
    contract: type[ContractBase],
    factory: Callable[[], TaskStore],
    *,
    only: Iterable[str] | None = None,
    **attributes: Any,
) -> dict[str, str]:
    """``{test: why}`` for every test of ``contract`` (or of ``only``) that fails on stores
    from ``factory``; ``attributes`` are set on the bound class (``expected_extensions=...``)."""
    bound = type("Bound", (contract,), {"make_store": lambda self: factory(), **attributes})
    found: dict[str, str] = {}
    for name in test_names(contract) if only is None else list(only):
        case = bound()
        method = getattr(case, name)
        try:
            case.setup_method(method)
            try:
                method()
            finally:
                case.teardown_method(method)
        except Exception as exc:
            found[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    return found


def caught_first(
    contract: type[ContractBase],
    factory: Callable[[], TaskStore],
    first: str | None,
    **attributes: Any,
) -> dict[str, str]:
    """The failures a broken store's verdict needs: those of ``first`` alone (the test that
    names the store's rule, or one known to catch it) when it fails, otherwise (``first`` is
    ``None``, unknown to the contract, or passes) those of the whole contract, so the verdict
    and its message are what the whole run gives. A store judged "caught" or "caught by
    ``first``" is judged so either way: that test fails in the whole run too (each runs on a
    fresh store of its own)."""
    if first is not None and not WHOLE and first in test_names(contract):
        failures = failures_of(contract, factory, only=[first], **attributes)
        if failures:
            return failures
    return failures_of(contract, factory, **attributes)
