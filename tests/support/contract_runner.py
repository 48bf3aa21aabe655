"""Running a shipped contract suite programmatically, the way pytest would (``setup_method``,
the test, ``teardown_method``), to prove its teeth on deliberately broken stores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chongming_redis.stores.protocol import TaskStore
from chongming_redis.testing.contract.support import ContractBase


def test_names(contract: type[ContractBase]) -> list[str]:
    return sorted(name for name in dir(contract) if name.startswith("test_"))


def failures_of(
    contract: type[ContractBase], factory: Callable[[], TaskStore], **attributes: Any
) -> dict[str, str]:
    """``{test: why}`` for every test of ``contract`` that fails on stores from ``factory``;
    ``attributes`` are set on the bound class (``expected_extensions=...``)."""
    bound = type("Bound", (contract,), {"make_store": lambda self: factory(), **attributes})
    found: dict[str, str] = {}
    for name in test_names(contract):
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
