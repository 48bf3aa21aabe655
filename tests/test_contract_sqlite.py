"""The shipped ``StoreContract`` bound to ``SqliteTaskStore``: a new database file per test
(``tests/support/sqlite_files.py``). The extensions and the feed are bound beside the other
stores' (``tests/test_extensions_contract.py``, ``tests/test_feed_contract.py``)."""

from __future__ import annotations

from chongming_redis.testing.store_contract import StoreContract
from tests.support.sqlite_files import SqliteFileBinding


class TestSqliteStoreContract(SqliteFileBinding, StoreContract):
    pass
