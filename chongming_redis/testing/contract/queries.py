"""``query``: every filter, their combinations, ordering, ``limit``."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from chongming_redis import (
    Progress,
    TaskQuery,
)
from chongming_redis.testing.contract.support import (
    CORE_STATUSES,
    FAILED,
    LOST,
    ONE_US,
    PAUSED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    T0,
    ContractBase,
    at,
    command,
    full_snapshot,
    snapshot,
)


class QueryRules(ContractBase):
    # -- query -------------------------------------------------------------------------------

    def test_query_of_an_empty_store_is_empty(self) -> None:
        assert self.store.query() == []
        assert self.store.query(None) == []
        assert self.where(statuses={PENDING}, tag="io", limit=5) == []
        assert self.where(newest_first=True) == []

    def test_query_none_returns_every_task_oldest_first(self) -> None:
        self.put(snapshot("b", created=2), snapshot("c", created=1), snapshot("a", created=3))
        assert self.ids(None) == ["c", "b", "a"]
        assert self.ids() == ["c", "b", "a"]
        assert self.ids(TaskQuery()) == ["c", "b", "a"]

    def test_query_orders_by_created_at_not_by_id_or_insertion(self) -> None:
        created = {"m": 5, "z": 1, "a": 9, "q": 3, "b": 7}
        self.put(*(snapshot(i, created=c) for i, c in created.items()))
        assert self.ids() == ["z", "q", "m", "b", "a"]
        self.put(snapshot("old", created=1.5, updated_at=at(100)), snapshot("new", created=2))
        assert self.ids() == ["z", "old", "new", "q", "m", "b", "a"]

    def test_query_newest_first_reverses_the_order(self) -> None:
        created = {"m": 5, "z": 1, "a": 9, "q": 3, "b": 7}
        self.put(*(snapshot(i, created=c) for i, c in created.items()))
        assert self.where(newest_first=True) == ["a", "b", "m", "q", "z"]

    def test_query_breaks_created_at_ties_by_task_id(self) -> None:
        self.put(*(snapshot(i, created=1) for i in ("b", "c", "a")), snapshot("0", created=2))
        assert self.ids() == ["a", "b", "c", "0"]
        assert self.where(newest_first=True) == ["0", "c", "b", "a"]

    def test_query_orders_by_the_instant_to_the_microsecond(self) -> None:
        east = datetime(2024, 3, 10, 14, 0, tzinfo=timezone(timedelta(hours=5)))  # 09:00 UTC
        west = datetime(2024, 3, 10, 5, 0, tzinfo=timezone(timedelta(hours=-5)))  # 10:00 UTC
        self.put(
            snapshot("west", created_at=west, updated_at=west),
            snapshot("east", created_at=east, updated_at=east),
        )
        assert self.ids() == ["east", "west"]
        self.put(
            snapshot("later", created_at=T0 + ONE_US, updated_at=T0),
            snapshot("earlier", created_at=T0, updated_at=T0),
        )
        assert self.ids() == ["east", "west", "earlier", "later"]

    def test_query_filters_by_any_of_the_given_statuses(self) -> None:
        self.put(*(snapshot(s.value, status=s, created=i) for i, s in enumerate(CORE_STATUSES)))
        assert self.where(statuses={RUNNING}) == ["running"]
        assert self.where(statuses={PENDING, FAILED, LOST}) == ["pending", "failed", "lost"]
        assert self.where(statuses=set(CORE_STATUSES)) == [s.value for s in CORE_STATUSES]

    def test_query_filters_by_exact_name(self) -> None:
        self.put(
            snapshot("1", name="job", created=1),
            snapshot("2", name="job2", created=2),
            snapshot("3", name="jo", created=3),
            snapshot("4", name="Job", created=4),
            snapshot("5", name="job", created=5),
        )
        assert self.where(name="job") == ["1", "5"]
        assert self.where(name="jo") == ["3"]
        assert self.where(name="nothing") == []

    def test_query_filters_by_name_prefix(self) -> None:
        self.put(
            snapshot("1", name="etl", created=1),
            snapshot("2", name="etl.load", created=2),
            snapshot("3", name="xetl", created=3),
            snapshot("4", name="et", created=4),
            snapshot("5", name="ETL.x", created=5),
        )
        assert self.where(name_prefix="etl") == ["1", "2"]
        assert self.where(name_prefix="e") == ["1", "2", "4"]
        assert self.where(name_prefix="etl.load.more") == []

    def test_name_prefix_is_matched_literally_not_as_a_pattern(self) -> None:
        names = ["a*b", "ab", "a_b", "axb", "a%b", "a[b", "a?b", "a.b", "a\\b", "a"]
        self.put(*(snapshot(f"t{i}", name=n, created=i) for i, n in enumerate(names)))
        for prefix in ("a*", "a_", "a%", "a[", "a?", "a.", "a\\"):
            expected = [f"t{i}" for i, n in enumerate(names) if n.startswith(prefix)]
            assert self.where(name_prefix=prefix) == expected, prefix

    def test_query_filters_by_exact_tag(self) -> None:
        self.put(
            snapshot("io", tags={"io"}, created=1),
            snapshot("ios", tags={"ios"}, created=2),
            snapshot("i", tags={"i"}, created=3),
            snapshot("both", tags={"io", "urgent"}, created=4),
            snapshot("none", created=5),
            snapshot("upper", tags={"IO"}, created=6),
            snapshot("prio", tags={"prio"}, created=7),
        )
        assert self.where(tag="io") == ["io", "both"]
        assert self.where(tag="i") == ["i"]
        assert self.where(tag="ios") == ["ios"]
        assert self.where(tag="o") == []
        assert self.where(tag="urgent") == ["both"]

    def test_tag_matching_is_exact_for_awkward_tags(self) -> None:
        # 'a"io' is '"a\\"io"' in JSON: a quoted-element search for '"io"' finds it
        tags = ['"io"', "io,ios", "io ", "[io]", "io\\", "i*", "%", 'a"io', "io"]
        self.put(*(snapshot(f"t{i}", tags={t}, created=i) for i, t in enumerate(tags)))
        for i, tag in enumerate(tags):
            assert self.where(tag=tag) == [f"t{i}"], tag
        assert self.where(tag="i") == []

    def test_query_filters_by_any_of_the_given_buckets(self) -> None:
        self.put(*(snapshot(f"b{b}", bucket=b, created=b) for b in (0, 1, 2, 3, 2**31 - 1)))
        assert self.where(buckets={1}) == ["b1"]
        assert self.where(buckets={0, 3}) == ["b0", "b3"]
        assert self.where(buckets={2**31 - 1, 99}) == [f"b{2**31 - 1}"]
        assert self.where(buckets={99}) == []

    def test_query_filters_by_pipeline_run_id(self) -> None:
        self.put(
            snapshot("a", pipeline_run_id="run-1", created=1),
            snapshot("b", pipeline_run_id="run-2", created=2),
            snapshot("c", pipeline_run_id="run-1", created=3),
            snapshot("d", created=4),
            snapshot("e", pipeline_run_id="run-10", created=5),
        )
        assert self.where(pipeline_run_id="run-1") == ["a", "c"]
        assert self.where(pipeline_run_id="run-2") == ["b"]
        assert self.where(pipeline_run_id="run") == []

    def test_query_combines_every_filter_with_and(self) -> None:
        base: dict[str, Any] = {
            "name": "etl.load",
            "status": RUNNING,
            "tags": {"io"},
            "bucket": 3,
            "pipeline_run_id": "run-1",
        }
        wrong: dict[str, dict[str, Any]] = {
            "status": {"status": PAUSED},
            "name": {"name": "etl.load2"},
            "prefix": {"name": "xetl.load"},
            "tag": {"tags": {"ios"}},
            "bucket": {"bucket": 4},
            "pipeline": {"pipeline_run_id": "run-2"},
        }
        self.put(snapshot("match1", created=1, **base), snapshot("match2", created=9, **base))
        for i, (task_id, change) in enumerate(wrong.items()):
            self.put(snapshot(task_id, created=2 + i, **{**base, **change}))
        everything: dict[str, Any] = {
            "statuses": {RUNNING, PENDING},
            "name": "etl.load",
            "name_prefix": "etl",
            "tag": "io",
            "buckets": {3, 5},
            "pipeline_run_id": "run-1",
        }
        assert self.where(**everything) == ["match1", "match2"]
        assert self.where(**everything, newest_first=True, limit=1) == ["match2"]
        assert self.where(statuses={RUNNING}, tag="io", buckets={3, 4}) == [
            "match1",
            "name",
            "prefix",
            "bucket",
            "pipeline",
            "match2",
        ]

    def test_query_limit_returns_the_first_tasks_in_order(self) -> None:
        self.put(*(snapshot(f"t{i}", created=10 - i) for i in range(6)))
        assert self.where(limit=2) == ["t5", "t4"]
        assert self.where(limit=2, newest_first=True) == ["t0", "t1"]
        assert self.where(limit=100) == ["t5", "t4", "t3", "t2", "t1", "t0"]
        assert self.where(limit=6) == self.ids()

    def test_query_limit_zero_returns_nothing(self) -> None:
        self.put(snapshot("a"), snapshot("b"))
        assert self.where(limit=0) == []

    def test_query_limit_applies_after_filtering(self) -> None:
        self.put(*(snapshot(f"t{i}", created=i, bucket=i % 2) for i in range(8)))
        assert self.where(buckets={1}, limit=2) == ["t1", "t3"]
        assert self.where(buckets={1}, limit=3, newest_first=True) == ["t7", "t5", "t3"]

    def test_query_reflects_a_status_change_by_save(self) -> None:
        self.put(snapshot("t1"), snapshot("t2", created=1))
        self.store.save(snapshot("t1", status=RUNNING, version=2), expect_version=1)
        assert self.where(statuses={PENDING}) == ["t2"]
        assert self.where(statuses={RUNNING}) == ["t1"]
        self.store.save(snapshot("t1", status=SUCCEEDED, version=3), expect_version=2)
        assert self.where(statuses={RUNNING}) == []
        assert self.where(statuses={SUCCEEDED}) == ["t1"]

    def test_query_reflects_a_tag_change_by_save(self) -> None:
        self.put(snapshot("t1", tags={"io", "old"}))
        self.store.save(snapshot("t1", version=2, tags={"ios", "new"}), expect_version=1)
        assert self.where(tag="io") == []
        assert self.where(tag="old") == []
        assert self.where(tag="ios") == ["t1"]
        assert self.where(tag="new") == ["t1"]

    def test_query_reflects_a_bucket_name_and_pipeline_change_by_save(self) -> None:
        self.put(snapshot("t1", name="old", bucket=1, pipeline_run_id="p1"))
        changed = snapshot("t1", name="new", bucket=2, pipeline_run_id="p2", version=2)
        self.store.save(changed, expect_version=1)
        assert self.where(buckets={1}) == [] and self.where(buckets={2}) == ["t1"]
        assert self.where(name="old") == [] and self.where(name="new") == ["t1"]
        assert self.where(name_prefix="o") == [] and self.where(name_prefix="n") == ["t1"]
        assert self.where(pipeline_run_id="p1") == []
        assert self.where(pipeline_run_id="p2") == ["t1"]

    # -- filters (round two) -----------------------------------------------------------------

    def test_an_empty_statuses_or_buckets_set_matches_nothing(self) -> None:
        self.put(*(snapshot(s.value, status=s, bucket=i, created=i) for i, s in
                   enumerate(CORE_STATUSES)))  # fmt: skip
        assert self.where(statuses=frozenset()) == []
        assert self.where(buckets=frozenset()) == []
        assert self.where(statuses=frozenset(), buckets={0}) == []
        assert self.where(buckets=set(), newest_first=True, limit=3) == []
        assert len(self.where(statuses=None, buckets=None)) == len(CORE_STATUSES)

    def test_limit_applies_after_every_filter(self) -> None:
        for i in range(12):
            match = i % 3 == 2
            self.put(
                snapshot(
                    f"t{i:02}",
                    created=i,
                    status=RUNNING if match else PENDING,
                    name="hit" if match else "miss",
                    tags={"io"} if match else {"ios"},
                    bucket=5 if match else 6,
                    pipeline_run_id="p" if match else "q",
                )
            )
        matches = ["t02", "t05", "t08", "t11"]
        filters: tuple[dict[str, Any], ...] = (
            {"statuses": {RUNNING}},
            {"name": "hit"},
            {"name_prefix": "h"},
            {"tag": "io"},
            {"buckets": {5}},
            {"pipeline_run_id": "p"},
            {"statuses": {RUNNING}, "tag": "io", "buckets": {5, 7}, "name": "hit"},
        )
        for given in filters:
            assert self.where(**given, limit=2) == matches[:2], given
            assert self.where(**given, limit=3, newest_first=True) == matches[::-1][:3], given
            assert self.where(**given, limit=1000) == matches, given

    def test_query_sees_what_touch_wrote(self) -> None:
        self.put(snapshot("t1", status=RUNNING), snapshot("t2", created=1))
        assert self.where(statuses={RUNNING}) == ["t1"]  # a first read a cache could keep
        self.store.touch("t1", progress=Progress(5, 10, "half"), heartbeat_at=at(3),
                         lease_owner="w", lease_until=at(9))  # fmt: skip
        expected = replace(snapshot("t1", status=RUNNING), progress=Progress(5, 10, "half"),
                           heartbeat_at=at(3), lease_owner="w", lease_until=at(9))  # fmt: skip
        assert self.store.query(TaskQuery(statuses=frozenset({RUNNING}))) == [expected]
        assert self.store.query()[0] == expected
        self.store.touch("t1", progress=Progress(6))
        assert self.store.query(TaskQuery(limit=1))[0].progress == Progress(6)
        assert self.store.get("t1") == replace(expected, progress=Progress(6))

    def test_query_returns_what_get_returns_for_every_task(self) -> None:
        self.put(full_snapshot(), snapshot("plain", created=-1), snapshot("tagged", tags={"a"}))
        self.store.touch("plain", lease_owner="w", lease_until=at(1))
        for got in self.store.query():
            assert self.store.get(got.task_id) == got

    def test_names_beyond_the_basic_plane_work_with_name_prefix(self) -> None:
        names = ["a", "a\uffff", "a\U0001f642", "a\U0001f642b", "a\U0010ffff", "b", "\U0001f642"]
        self.put(*(snapshot(f"t{i}", name=n, created=i) for i, n in enumerate(names)))
        assert self.where(name_prefix="a") == ["t0", "t1", "t2", "t3", "t4"]
        assert self.where(name_prefix="a\U0001f642") == ["t2", "t3"]
        assert self.where(name_prefix="\U0001f642") == ["t6"]
        assert self.where(name="a\U0001f642") == ["t2"]
        assert self.where(name_prefix="a\U0010ffff") == ["t4"]

    # -- found by an independent review of the suite (round two) --------------------

    def test_ties_are_broken_by_code_point_order(self) -> None:
        ids = ["B", "a", "\uffff", "\U0001f642"]
        self.put(*(snapshot(i, created=1) for i in ids))
        assert self.ids() == sorted(ids)
        for i in ids:
            self.store.submit_command(command(i, created=1))
        assert self.claimed(0) == sorted(ids)
