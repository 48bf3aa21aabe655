"""The contract of keyset paging (``PagedQueryStore.query_page``): mixed into
``ExtensionsContract``. Each test returns at once when the store does not implement it.

The tests check invariants rather than single answers: walking every filter in both directions
page by page, at page sizes that divide the result exactly and that do not, gives back exactly
``query`` (nothing repeated, nothing skipped, ties on ``created_at`` included) and ends on a
short or empty page; positions between, before and after stored tasks (and of pruned ones)
give what the order says, to the microsecond and by code point among ties.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from chongming_redis.errors import StoreClosed
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores.extensions import PagedQueryStore
from chongming_redis.testing.contract.support import (
    NAIVE,
    ONE_US,
    PAUSED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    T0,
    ContractBase,
    at,
    raises,
    snapshot,
)

P, R, PA, OK, F = PENDING, RUNNING, PAUSED, SUCCEEDED, TaskStatus.FAILED

#: (id, seconds after T0, name, status, bucket, tags, pipeline): ties on created_at among ids
#: whose code point order differs from a naive or prefix order ("T" < "t1" < "t10" < "t2" <
#: "é"), and every filter kind selecting a different subset.
POPULATION: tuple[tuple[str, float, str, TaskStatus, int, tuple[str, ...], str | None], ...] = (
    ("a", 0, "mail", P, 0, ("cpu",), "run-1"),
    ("z", 0, "etl.extract", R, 2, ("io",), None),
    ("t1", 1, "etl.load", P, 0, ("io",), "run-1"),
    ("t10", 1, "etl.load", OK, 1, ("io", "cpu"), None),
    ("t2", 1, "etl.extract", P, 0, (), "run-1"),
    ("T", 1, "mail", F, 2, ("io",), None),
    ("é", 1, "etl.load", P, 1, (), "run-2"),
    ("b", 2, "etl.load", OK, 0, ("io",), "run-1"),
    ("c", 2.000001, "mail", P, 1, (), None),
    ("d", 3, "etl.load", PA, 0, ("io",), "run-2"),
    ("e", 3, "etl.load", P, 0, ("cpu",), "run-1"),
    ("f", 4, "mail", OK, 2, ("io",), None),
)

QUERIES: tuple[TaskQuery, ...] = (
    TaskQuery(),
    TaskQuery(statuses=frozenset({P})),
    TaskQuery(statuses=frozenset({P, OK})),
    TaskQuery(name="etl.load"),
    TaskQuery(name_prefix="etl."),
    TaskQuery(tag="io"),
    TaskQuery(buckets=frozenset({0, 2})),
    TaskQuery(pipeline_run_id="run-1"),
    TaskQuery(statuses=frozenset({P, PA}), buckets=frozenset({0}), tag="io"),
    TaskQuery(name="nobody"),
)

#: Page sizes: 1 and the exact divisors of 12 (the whole population) end on an empty page,
#: the others on a short one.
PAGE_SIZES = (1, 2, 3, 4, 5, 6, 12, 13)


def task(task_id: str, created: float, **fields: Any) -> TaskSnapshot:
    return snapshot(task_id, created=created, **fields)


class PagedQueryContract(ContractBase):
    def paged(self) -> PagedQueryStore | None:
        return self.store if isinstance(self.store, PagedQueryStore) else None

    def page_ids(self, store: PagedQueryStore, after: tuple[datetime, str] | None,
                 limit: int | None = None, **filters: Any) -> list[str]:  # fmt: skip
        found = store.query_page(TaskQuery(limit=limit, **filters), after=after)
        return [s.task_id for s in found]

    def walk(self, store: PagedQueryStore, query: TaskQuery, size: int) -> list[TaskSnapshot]:
        """Every page of ``query`` at ``size``, each from the last task of the one before;
        checks each page's length and that the walk ends on the first short page."""
        everything = self.store.query(query)
        pages: list[list[TaskSnapshot]] = []
        after: tuple[datetime, str] | None = None
        while True:
            page = store.query_page(replace(query, limit=size), after=after)
            pages.append(page)
            assert len(page) <= size, (query, size, after, "longer than the limit")
            assert len(pages) <= len(everything) // size + 1, (query, size, "the walk never ends")
            if len(page) < size:
                break
            after = (page[-1].created_at, page[-1].task_id)
        assert len(pages) == len(everything) // size + 1, (query, size, [len(p) for p in pages])
        return [item for page in pages for item in page]

    def test_query_pages_concatenate_to_the_whole_query_for_every_filter_and_direction(
        self,
    ) -> None:
        if (store := self.paged()) is None:
            return
        for task_id, created, name, status, bucket, tags, pipeline in POPULATION:
            self.put(task(task_id, created, name=name, status=status, bucket=bucket,
                          tags=frozenset(tags), pipeline_run_id=pipeline))  # fmt: skip
        for query in QUERIES:
            for newest_first in (False, True):
                ordered = replace(query, newest_first=newest_first)
                everything = self.store.query(ordered)
                assert store.query_page(ordered) == everything  # no position: query itself
                assert store.query_page(ordered, after=None) == everything
                for size in PAGE_SIZES:
                    walked = self.walk(store, ordered, size)
                    assert walked == everything, (ordered, size)

    def test_a_page_starts_strictly_after_its_position_among_ties_and_microseconds(
        self,
    ) -> None:
        if (store := self.paged()) is None:
            return
        for task_id, created in (("x", 0), ("a", 1), ("b", 1), ("c", 1), ("m", 1.000001),
                                 ("z", 2), ("t1", 3), ("t10", 3), ("t2", 3), ("T", 3),
                                 ("é", 3)):  # fmt: skip
            self.put(task(task_id, created))
        # Ascending: x | a b c | m | z | T t1 t10 t2 é
        ids = self.page_ids
        assert ids(store, (at(1), "b"), 2) == ["c", "m"]
        assert ids(store, (at(1), "b"), newest_first=True) == ["a", "x"]
        assert ids(store, (at(1), "bb"), 2) == ["c", "m"]  # between two stored ids
        assert ids(store, (at(1), "bb"), newest_first=True) == ["b", "a", "x"]
        assert ids(store, (at(1), "a"), 3) == ["b", "c", "m"]
        assert ids(store, (at(1), "c"), 1) == ["m"]  # a microsecond later, not a tie
        assert ids(store, (at(1), "c"), 2, newest_first=True) == ["b", "a"]
        assert ids(store, (at(1) - ONE_US, "zzz"), 3) == ["a", "b", "c"]
        assert ids(store, (at(1) - ONE_US, "zzz"), newest_first=True) == ["x"]
        assert ids(store, (at(1) + ONE_US, "a"), 2) == ["m", "z"]
        assert ids(store, (at(1) + ONE_US, "a"), 3, newest_first=True) == ["c", "b", "a"]
        assert ids(store, (at(1) + ONE_US, "m"), 1) == ["z"]
        assert ids(store, (at(1) + ONE_US, "m"), 1, newest_first=True) == ["c"]
        assert ids(store, (at(3), "t1")) == ["t10", "t2", "é"]  # t1 < t10, exactly
        assert ids(store, (at(3), "t1"), 2, newest_first=True) == ["T", "z"]
        assert ids(store, (at(3), "t")) == ["t1", "t10", "t2", "é"]
        assert ids(store, (at(3), "t2")) == ["é"]
        assert ids(store, (at(3), "é")) == []  # after the last task: an empty page
        assert ids(store, (at(-1), "zzz"), 2) == ["x", "a"]
        assert ids(store, (at(-1), "zzz"), newest_first=True) == []
        assert ids(store, (at(100), "a")) == []
        assert ids(store, (at(100), "a"), 1, newest_first=True) == ["é"]
        assert ids(store, (at(0), "x"), newest_first=True) == []
        assert ids(store, (at(0), "x"), 0) == []  # limit 0: nothing, as query
        assert ids(store, (at(1), "b"), 2, name="job", statuses=frozenset({P})) == ["c", "m"]

    def test_a_page_after_a_pruned_task_resumes_where_it_was(self) -> None:
        if (store := self.paged()) is None:
            return
        self.put(*(task(f"s{i}", i, status=OK) for i in range(6)), task("p", 2.5))
        first = store.query_page(TaskQuery(limit=2))
        assert [s.task_id for s in first] == ["s0", "s1"]
        assert self.store.prune(keep_terminal=3) == 3  # s0, s1, s2: the position is gone
        after = (first[-1].created_at, first[-1].task_id)
        assert self.page_ids(store, after, 2) == ["p", "s3"]
        self.put(task("n", 4.5))  # created while paging: found by a later page
        assert self.page_ids(store, (at(3), "s3"), 2) == ["s4", "n"]
        assert self.page_ids(store, (at(4.5), "n"), 2) == ["s5"]
        assert self.page_ids(store, (at(3), "s3"), newest_first=True) == ["p"]
        assert self.page_ids(store, (at(2), "s2"), newest_first=True) == []
        done = frozenset({OK})
        assert self.page_ids(store, (at(1), "s1"), statuses=done) == ["s3", "s4", "s5"]
        assert self.page_ids(store, (at(2), "s2"), 1, statuses=done) == ["s3"]

    def test_query_page_refuses_a_bad_position_before_the_backend(self) -> None:
        if (store := self.paged()) is None:
            return
        self.put(task("a", 0))
        before_epoch = datetime(1969, 12, 31, 23, 59, tzinfo=timezone.utc)
        text = T0.isoformat()
        type_errors: list[Any] = ["x", (T0,), (T0, "a", 1), [T0, "a"], (T0, 5), (None, "a"),
                                  (text, "a"), (T0.timestamp(), "a")]  # fmt: skip
        value_errors: list[Any] = [(NAIVE, "a"), (T0, ""), (before_epoch, "a"), (T0, "é" * 513)]

        def refused() -> None:
            for bad in type_errors:
                raises(TypeError, store.query_page, None, after=bad)
            for bad in value_errors:
                raises(ValueError, store.query_page, TaskQuery(), after=bad)
            raises(TypeError, store.query_page, "not a query", after=(T0, "a"))

        refused()
        assert self.store.query() == [task("a", 0)]
        self.close_store()
        refused()  # still the argument's error, not StoreClosed: nothing reached the backend
        raises(StoreClosed, store.query_page, None, after=(T0, "a"))
        raises(StoreClosed, store.query_page)
