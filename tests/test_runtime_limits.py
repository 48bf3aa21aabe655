"""Limits in the runtime (issue 26): ``@app.task(limits=...)`` checked and bound at
decoration, refs resolved at every submit path (from the app, else from the definitions the
workers recorded), the worker recording its definitions before it starts anything (a
conflicting one refused unless ``replace_limits``; a store that would not enforce them
refused), and a real in-process worker never running more than ``max`` tasks of one key at
once while other keys run beside them.

On ``InMemoryTaskStore``, the reference of the limits; no timing assertions: intervals are
compared with each other, never with a duration.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from chongming_redis import (
    App,
    Client,
    Concurrency,
    Controller,
    InMemoryTaskStore,
    LimitConflict,
    LimitKeyError,
    RateLimit,
    TaskStatus,
)
from chongming_redis.limits import to_json
from chongming_redis.runtime import limit_defs
from chongming_redis.runtime.limit_defs import DefinitionsCache, LimitsNotEnforced
from tests.support.flaky_store import ProtocolOnlyStore
from tests.support.limits_app import Export, export, export_refs
from tests.support.limits_app import app as limits_app

WAIT = 30.0
FAST: dict[str, Any] = {"command_poll_interval": 0.05, "start_poll_interval": 0.02,
                        "reconcile_interval": 0.2, "progress_interval": 0.05}  # fmt: skip


def total(store: InMemoryTaskStore) -> int:
    return sum(store.counts().values())


def wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- the decorator ------------------------------------------------------------------------------


def test_the_decorator_binds_ids_and_app_lists_the_definitions() -> None:
    app = App("a")

    @app.task(limits=[Concurrency(2, per="customer"), RateLimit(100, per=1.0)])
    def export(ctx: Any, params: Any) -> None: ...

    @app.task(limits=[RateLimit(5, per=2.0, name="api")])
    def call(ctx: Any, params: Any) -> None: ...

    @app.task()
    def plain(ctx: Any, params: Any) -> None: ...

    assert [b.id for b in app.get("export").limits] == ["export.concurrency", "export.rate"]
    assert app.get("plain").limits == ()
    definitions, task_limits = app.limit_definitions()
    assert task_limits == {"export": ("export.concurrency", "export.rate"), "call": ("api",)}
    assert definitions["api"] == to_json(RateLimit(5, per=2.0))
    assert definitions["export.concurrency"] == to_json(Concurrency(2, per="customer"))


@pytest.mark.parametrize(
    ("limits", "error"),
    [
        ([3], TypeError),  # not a limit
        ("Concurrency", TypeError),  # a str is not a list of limits
        (None, TypeError),
        ([Concurrency(1), Concurrency(2)], ValueError),  # two with one id
        ([RateLimit(1, name="x"), Concurrency(1, name="x")], ValueError),
        ([Concurrency(1, name=f"l{i}") for i in range(9)], ValueError),  # more than 8
    ],
)
def test_bad_limits_are_typed_errors_at_decoration_and_register_nothing(
    limits: Any, error: type[Exception]
) -> None:
    app = App("a")
    with pytest.raises(error):
        app.task(limits=limits)(lambda ctx, params: None)
    assert app.types == {}


def test_bad_values_are_refused_by_the_limits_themselves() -> None:
    with pytest.raises(ValueError, match=r"Concurrency\.max"):
        Concurrency(0)
    with pytest.raises(ValueError, match=r"Concurrency\.per"):
        Concurrency(1, per="not a field")
    with pytest.raises(TypeError, match=r"RateLimit\.per"):
        RateLimit(1, per="1s")  # type: ignore[arg-type]


def test_a_shared_name_must_be_one_definition_in_one_app() -> None:
    app = App("a")
    app.task("one", limits=[Concurrency(2, name="db")])(lambda ctx, params: None)
    app.task("two", limits=[Concurrency(2, name="db")])(lambda ctx, params: None)  # the same: ok
    with pytest.raises(ValueError, match="'db' is defined as"):
        app.task("three", limits=[Concurrency(3, name="db")])(lambda ctx, params: None)
    assert set(app.types) == {"one", "two"}


# -- submit: refs resolved from the params ------------------------------------------------------


class Order(BaseModel):
    customer_id: int
    region: str


@pytest.fixture
def store() -> Iterator[InMemoryTaskStore]:
    s = InMemoryTaskStore()
    yield s
    s.close()


def order_app() -> App:
    app = App("orders")

    @app.task(limits=[Concurrency(1, per="customer_id"), RateLimit(10, key="region")])
    def ship(ctx: Any, params: Order) -> None: ...

    return app


def test_submit_resolves_refs_from_dict_and_model_params(store: InMemoryTaskStore) -> None:
    client = Client(store, app=limits_app)
    by_dict = client.submit("export", {"customer": "acme"})
    by_model = client.submit(export.task_type, Export(customer="zeta"))
    typed = export.submit(client, customer="k")
    assert store.get(by_dict.task_id).limits == export_refs("acme")  # type: ignore[union-attr]
    assert store.get(by_model.task_id).limits == export_refs("zeta")  # type: ignore[union-attr]
    assert store.get(typed.task_id).limits == export_refs("k")  # type: ignore[union-attr]
    # A pydantic model's int field is a key as its text; the refs keep the limits' order.
    ship = Client(store, app=order_app()).submit("ship", Order(customer_id=7, region="eu"))
    assert store.get(ship.task_id).limits == ("ship.concurrency=7", "ship.rate=eu")  # type: ignore[union-attr]


def test_a_task_without_limits_gets_no_refs(store: InMemoryTaskStore) -> None:
    app = App("a")
    app.task("plain")(lambda ctx, params: None)
    handle = Client(store, app=app).submit("plain", {"customer": "x"})
    assert store.get(handle.task_id).limits == ()  # type: ignore[union-attr]


class Loose(BaseModel):
    customer: str | None = None


def test_a_missing_key_is_limit_key_error_and_nothing_is_written(store: InMemoryTaskStore) -> None:
    app = App("a")
    app.task("loose", params=Loose, limits=[Concurrency(1, per="customer")])(
        lambda ctx, params: None
    )
    app.task("free", limits=[Concurrency(1, per="customer")])(lambda ctx, params: None)
    client = Client(store, app=app)
    with pytest.raises(LimitKeyError, match="customer"):
        client.submit("loose", {})  # valid params, None is no key
    with pytest.raises(LimitKeyError, match="missing"):
        client.submit("free", {"other": 1})
    with pytest.raises(LimitKeyError):  # one bad set among good ones: none written
        client.submit_many("free", [{"customer": "a"}, {"customer": 1.5}, {"customer": "b"}])
    controller = Controller(store, app=app)
    with pytest.raises(LimitKeyError):
        controller.submit("free", {})
    with pytest.raises(LimitKeyError):
        controller.submit_many("free", [{"customer": "a"}, {}])
    assert total(store) == 0


def test_the_controllers_submit_paths_resolve_refs(store: InMemoryTaskStore) -> None:
    controller = Controller(store, app=limits_app)
    one = controller.submit("export", {"customer": "acme"})
    many = controller.submit_many("export", [{"customer": "a"}, {"customer": "b"}])
    assert store.get(one).limits == export_refs("acme")  # type: ignore[union-attr]
    assert [store.get(i).limits for i in many] == [export_refs("a"), export_refs("b")]  # type: ignore[union-attr]


# -- a producer without the app -----------------------------------------------------------------


def test_a_producer_without_the_app_resolves_refs_from_the_recorded_definitions(
    store: InMemoryTaskStore,
) -> None:
    early = Client(store)  # before any worker: the documented corner, no refs
    unlimited = early.submit("export", {"customer": "acme"})
    assert store.get(unlimited.task_id).limits == ()  # type: ignore[union-attr]
    Controller(store, app=limits_app).record_limits()  # what a worker does at start
    producer = Client(store)
    handle = producer.submit("export", {"customer": "acme"})
    assert store.get(handle.task_id).limits == export_refs("acme")  # type: ignore[union-attr]
    charged = producer.submit_many("charge", [{}, {"x": 1}])
    assert [store.get(h.task_id).limits for h in charged] == [("payments",), ("payments",)]  # type: ignore[union-attr]
    before = total(store)
    with pytest.raises(LimitKeyError, match="customer"):
        producer.submit("export", {"n": 1})
    with pytest.raises(LimitKeyError):
        producer.submit_many("export", [{"customer": "a"}, {}])
    assert total(store) == before


def test_the_producers_definitions_are_read_again_once_stale() -> None:
    now = [100.0]
    cache = DefinitionsCache(clock=lambda: now[0])
    assert not cache.fresh() and cache.of("export") == ()
    cache.update(limits_app.limit_definitions())
    assert cache.fresh()
    assert [b.id for b in cache.of("export")] == ["export.concurrency", "payments"]
    now[0] += limit_defs.RECORDED_TTL
    assert not cache.fresh()
    cache.update(None)  # a store that records no limits: none
    assert cache.fresh() and cache.of("export") == ()


def test_an_unreadable_or_unrecorded_definition_limits_nothing() -> None:
    by_type = limit_defs.bound_by_type(({"a": "{not json", "b": to_json(Concurrency(1))},
                                        {"t": ("a", "b", "c")}))  # fmt: skip
    assert [b.id for b in by_type["t"]] == ["b"]


# -- the worker records its definitions ---------------------------------------------------------


def test_the_worker_records_its_definitions_at_start(store: InMemoryTaskStore) -> None:
    controller = Controller(store, app=limits_app, **FAST)
    controller.start()
    try:
        assert store.limit_definitions() == limits_app.limit_definitions()
    finally:
        controller.shutdown(grace=1)


def conflicting_app() -> App:
    app = App("other")
    app.task("export", limits=[Concurrency(5, per="customer")])(lambda ctx, params: None)
    return app


def test_a_conflicting_definition_stops_the_worker_before_it_starts_anything(
    store: InMemoryTaskStore,
) -> None:
    Controller(store, app=limits_app).record_limits()
    task_id = Client(store, app=limits_app).submit("export", {"customer": "acme"}).task_id
    controller = Controller(store, app=conflicting_app(), **FAST)
    with pytest.raises(LimitConflict, match="--replace-limits") as raised:
        controller.start()
    assert "\n" not in str(raised.value)
    assert raised.value.limit_id == "export.concurrency"
    assert controller._threads == []  # nothing runs
    assert store.get(task_id).status is TaskStatus.PENDING  # type: ignore[union-attr]
    assert store.limit_definitions() == limits_app.limit_definitions()  # nothing recorded


def test_replace_limits_records_the_new_definition(store: InMemoryTaskStore) -> None:
    Controller(store, app=limits_app).record_limits()
    Controller(store, app=conflicting_app(), replace_limits=True).record_limits()
    definitions, task_limits = store.limit_definitions()
    assert definitions["export.concurrency"] == to_json(Concurrency(5, per="customer"))
    assert task_limits["export"] == ("export.concurrency",)


def test_a_store_that_would_not_enforce_limits_is_refused(store: InMemoryTaskStore) -> None:
    bare = ProtocolOnlyStore(store, failing=())
    with pytest.raises(LimitsNotEnforced, match="no LimitsStore") as raised:
        Controller(bare, app=limits_app, **FAST).start()  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)
    app = App("plain")  # an app without limits runs on it as before
    app.task("t")(lambda ctx, params: None)
    Controller(bare, app=app).record_limits()  # type: ignore[arg-type]


# -- a real worker: never more than max per key, keys in parallel -------------------------------


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def enforcing_store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """The reference, and SQLite and Redis once their stores enforce limits."""
    from chongming_redis.stores.extensions import LimitsStore
    from chongming_redis.stores.redis import RedisTaskStore
    from chongming_redis.stores.urls import open_store_url

    if request.param == "memory":
        store: Any = InMemoryTaskStore()
    elif request.param == "sqlite":
        store = open_store_url(f"sqlite:///{tmp_path / 'limits.db'}", namespace="default")
    else:
        url = request.getfixturevalue("redis_proc").url
        store = RedisTaskStore.from_url(url, namespace=request.getfixturevalue("namespace"))
    if not isinstance(store, LimitsStore):
        store.close()
        pytest.skip(f"the {request.param} store does not enforce limits yet")
    yield store
    store.close()


def test_a_worker_runs_at_most_max_per_customer_and_customers_in_parallel(
    enforcing_store: Any,
) -> None:
    store = enforcing_store
    app = App("intervals")
    lock, intervals, begun = threading.Lock(), [], []
    release = threading.Event()

    @app.task(limits=[Concurrency(2, per="customer")])
    def job(ctx: Any, params: dict[str, Any]) -> None:
        began = time.monotonic()
        with lock:
            begun.append(params["customer"])
        # The first ones are held until 4 have begun: 4 at once is more than one customer's
        # max, so it happens only if the customers run beside each other.
        release.wait(timeout=WAIT)
        with lock:
            intervals.append((params["customer"], began, time.monotonic()))

    client = Client(store, app=app)
    customers = ["acme", "bolt", "core"]
    handles = [client.submit("job", {"customer": c, "i": i})
               for i in range(6) for c in customers]  # fmt: skip
    controller = Controller(store, app=app, concurrency=6, **FAST)

    controller.start()
    try:
        wait_until(lambda: len(begun) >= 4, "4 tasks running at once")
        release.set()
        wait_until(lambda: store.counts().get(TaskStatus.SUCCEEDED, 0) == len(handles), "all done")
    finally:
        controller.shutdown(grace=5)
    assert len(intervals) == len(handles)
    assert max(overlap(intervals, c) for c in customers) == 2  # the limit, reached, never passed
    assert overlap(intervals, None) >= 4  # more than one customer's max at once


def overlap(intervals: list[tuple[str, float, float]], customer: str | None) -> int:
    """The most intervals (of ``customer``, or of all) open at one instant."""
    events = []
    for who, began, ended in intervals:
        if customer is None or who == customer:
            events += [(began, 1), (ended, -1)]
    most = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start
        now += step
        most = max(most, now)
    return most


# -- the async client (Redis keeps the refs; enforcing them is the store's part) ---------------


@pytest.mark.redis
def test_the_async_client_resolves_refs_and_refuses_a_missing_key(
    redis_proc: Any, namespace: str
) -> None:
    import asyncio

    from chongming_redis import AsyncClient
    from chongming_redis.stores.redis import RedisTaskStore

    free = App("free")  # dict params: the limit finds the key missing, not pydantic
    free.task("free", limits=[Concurrency(1, per="customer")])(lambda ctx, params: None)

    async def main() -> tuple[str, list[str]]:
        async with AsyncClient.from_url(redis_proc.url, namespace=namespace,
                                        app=limits_app) as client:  # fmt: skip
            one = await client.submit("export", {"customer": "acme"})
            many = await export.asubmit_many(client, [{"customer": "a"}, {"customer": "7"}])
        async with AsyncClient.from_url(redis_proc.url, namespace=namespace, app=free) as bare:
            with pytest.raises(LimitKeyError):
                await bare.submit("free", {"n": 1})
            with pytest.raises(LimitKeyError):
                await bare.submit_many("free", [{"customer": "b"}, {"customer": None}])
        return one.task_id, [h.task_id for h in many]

    one, many = asyncio.run(main())
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    try:
        assert store.get(one).limits == export_refs("acme")  # type: ignore[union-attr]
        assert [store.get(i).limits for i in many] == [export_refs("a"), export_refs("7")]  # type: ignore[union-attr]
        assert sum(store.counts().values()) == 3  # the refused ones wrote nothing
    finally:
        store.close()


@pytest.mark.redis
def test_an_async_producer_without_the_app_resolves_refs_from_the_recorded_definitions(
    redis_proc: Any, namespace: str
) -> None:
    import asyncio

    from chongming_redis import AsyncClient
    from chongming_redis.stores.redis import RedisTaskStore

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    try:
        Controller(store, app=limits_app).record_limits()  # what a worker does at start

        async def main() -> tuple[str, list[str]]:
            async with AsyncClient.from_url(redis_proc.url, namespace=namespace) as producer:
                one = await producer.submit("export", {"customer": "acme"})
                many = await producer.submit_many("charge", [{}, {"x": 1}])
                with pytest.raises(LimitKeyError, match="customer"):
                    await producer.submit("export", {"n": 1})
            return one.task_id, [h.task_id for h in many]

        one, many = asyncio.run(main())
        assert store.get(one).limits == export_refs("acme")  # type: ignore[union-attr]
        assert [store.get(i).limits for i in many] == [("payments",), ("payments",)]  # type: ignore[union-attr]
        assert sum(store.counts().values()) == 3  # the refused one wrote nothing
    finally:
        store.close()
