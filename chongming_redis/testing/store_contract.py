"""``StoreContract``: the executable ``TaskStore`` contract, for any backend.

Bind it to a backend with one factory and let pytest collect the subclass::

    from chongming_redis.testing.store_contract import StoreContract

    class TestMyStore(StoreContract):
        def make_store(self) -> TaskStore:
            return MyStore(...)  # a fresh, isolated store on every call

The suite imports no test framework: plain ``assert`` and a local ``raises`` helper, with
``setup_method``/``teardown_method`` hooks that pytest calls on plain classes (and any other
runner can call by hand). The class name does not start with ``Test``, so only bindings are
collected. It checks what one connection can see: the semantics of the 14 methods (store guide
§2, §6, the checklist of §8 and the pitfalls of §9). Cross-process atomicity is not covered;
each backend proves that with its own concurrent tests.

Times are fixed instants (never the wall clock), so the suite is deterministic. Where a
protocol docstring leaves a behaviour open, the suite does not test it.

The tests live in one module per part of the protocol (``chongming_redis.testing.contract``);
``StoreContract`` gathers them.
"""

from __future__ import annotations

from chongming_redis.testing.contract.bad_input import BadInputRules
from chongming_redis.testing.contract.commands import CommandRules
from chongming_redis.testing.contract.history import CountsAndHistoryRules
from chongming_redis.testing.contract.operations import OperationRules
from chongming_redis.testing.contract.queries import QueryRules
from chongming_redis.testing.contract.records import RecordRules
from chongming_redis.testing.contract.saves import SaveRules
from chongming_redis.testing.contract.support import raises
from chongming_redis.testing.contract.touch import TouchRules

__all__ = ["StoreContract", "raises"]


class StoreContract(
    RecordRules,
    SaveRules,
    QueryRules,
    CountsAndHistoryRules,
    TouchRules,
    CommandRules,
    OperationRules,
    BadInputRules,
):
    """The ``TaskStore`` contract as test methods. Subclass it and define ``make_store``."""
