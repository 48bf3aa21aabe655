"""Published parameter schemas (issue 30, item 1): a worker publishes each task type's JSON
Schema when it starts (``runtime/task_schemas.py``), and a client without ``app=`` checks
parameters against it before anything is written (``client/params_check.py``):

* in-process workers on the in-memory store and a real Redis: what is published (``{}`` for a
  type without a model); bad parameters refused with ``InvalidParams`` naming the field, and
  nothing written (``submit``, ``submit_many``, a workflow); good ones run; a type without a
  model takes any JSON-able value; ``app=`` keeps pydantic's validation; a newer worker's
  schema is enforced once the client's cached copy is older than ``SCHEMA_TTL``; a schema no
  JSON Schema library can compile is a ``CorruptRecord``; a store without the extension stores
  parameters as given; ``AsyncClient`` on Redis and on Redis Cluster;
* real worker processes on Redis, a SQLite file and PostgreSQL, a producer on ``from_url``
  alone, and a newer release of the worker whose changed schema a new producer enforces;
* the CLI's one command that writes without the app, ``schedules upsert``: one ``error:`` line,
  exit 1, nothing stored. (``submit`` always loads the app: pydantic validates there.)
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chongming_redis import AsyncClient, Client, TaskStatus
from chongming_redis.client import params_check
from chongming_redis.errors import CorruptRecord, InvalidParams
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.task_schema_store import TaskSchemasStore
from tests.support.redis_server import RedisProc
from tests.support.schema_app import Echo, app, newer
from tests.support.store_targets import STORE_KINDS, StoreTarget
from tests.test_cli import ROOT, cli, ok, user_error

#: Parameters of ``echo`` (``x: int``, ``size: {width: int, height: int = 1} | None``) that do
#: not validate, and the field each names.
BAD_ECHO = [
    ({"x": "not-an-int"}, "x", "'not-an-int' is not of type 'integer'"),
    ({}, "x", "'x' is a required property"),
    (None, "x", "'x' is a required property"),  # None is validated as {}, as the model does
    ({"x": 1, "size": {"width": "wide"}}, "size.width", "'wide' is not of type 'integer'"),
    ({"x": 1, "size": {"height": 2}}, "size.width", "'width' is a required property"),
    ([1], None, "[1] is not of type 'object'"),
]


@pytest.fixture
def worker(memory_or_redis_store: Any) -> Iterator[Controller]:
    controller = Controller(memory_or_redis_store, app=app, start_poll_interval=0.05)
    controller.start()
    yield controller
    controller.shutdown(grace=5)


def published(store: TaskSchemasStore, name: str) -> dict[str, Any]:
    return json.loads(store.task_schemas([name])[name].schema)  # type: ignore[no-any-return]


def test_a_worker_publishes_each_types_schema_and_any_value_without_a_model(
    memory_or_redis_store: Any, worker: Controller
) -> None:
    store = memory_or_redis_store
    assert published(store, "echo") == Echo.model_json_schema()
    assert published(store, "free") == {}
    assert set(store.task_schemas()) == {"echo", "free"}


def test_bad_params_are_refused_naming_the_field_and_nothing_is_written(
    memory_or_redis_store: Any, worker: Controller
) -> None:
    client = Client(memory_or_redis_store)  # no app: the published schema checks
    for params, field, reason in BAD_ECHO:
        with pytest.raises(InvalidParams) as caught:
            client.submit("echo", params, task_id="t-bad")
        error = caught.value
        assert (error.task, error.field, error.reason) == ("echo", field, reason), params
        assert f"{field or 'params'}: {reason}" in str(error)
        assert "\n" not in str(error)  # one line: what the CLI prints
        assert client.get("t-bad") is None and client.list() == []
        assert sum(client.stats().values()) == 0
        again = pickle.loads(pickle.dumps(error))
        assert (str(again), again.field, again.reason) == (str(error), field, reason)


def test_good_params_are_accepted_and_run_and_a_type_without_model_takes_any_value(
    memory_or_redis_store: Any, worker: Controller
) -> None:
    client = Client(memory_or_redis_store)
    handle = client.submit("echo", {"x": 3, "size": {"width": 7}})
    assert handle.wait(timeout=20) == {"x": 3, "size": {"width": 7, "height": 1}}
    for anything in ({"a": [1, "b", None]}, "text", 5, [1, 2], None, (1, 2)):
        task = client.submit("free", anything)
        assert task.wait(timeout=20) == (
            list(anything) if isinstance(anything, tuple) else anything
        )
    with pytest.raises(TypeError):  # not JSON-able: refused as before, nothing written
        client.submit("free", {"when": object()}, task_id="t-odd")
    assert client.get("t-odd") is None


def test_submit_many_and_a_workflow_check_every_set_before_writing_any(
    memory_or_redis_store: Any, worker: Controller
) -> None:
    client = Client(memory_or_redis_store)
    with pytest.raises(InvalidParams) as caught:
        client.submit_many("echo", [{"x": 1}, {"x": 2}, {"x": "three"}, {"x": 4}])
    assert caught.value.field == "x"
    assert str(caught.value).startswith("parameter set 2 of 4: "), "which set"
    flow = client.workflow()
    first = flow.add("free", {"any": "thing"})
    flow.add("echo", {"x": 1, "size": {"width": "w"}}, after=[first])
    with pytest.raises(InvalidParams) as in_graph:
        flow.submit()
    assert in_graph.value.field == "size.width"
    assert client.list() == [] and sum(client.stats().values()) == 0
    assert len(client.submit_many("echo", ({"x": n} for n in range(3)))) == 3  # a generator
    assert client.submit_many("echo", []) == []


def test_with_the_app_pydantic_validates_as_before(
    memory_or_redis_store: Any, worker: Controller
) -> None:
    with_app, without = Client(memory_or_redis_store, app=app), Client(memory_or_redis_store)
    assert with_app.submit("echo", {"x": "5"}).wait(timeout=20) == {"x": 5, "size": None}
    with pytest.raises(InvalidParams, match="not of type 'integer'"):  # JSON is strict
        without.submit("echo", {"x": "5"})
    with pytest.raises(InvalidParams) as caught:
        with_app.submit("echo", {"x": "abc"})
    assert caught.value.field == "x" and caught.value.reason is not None
    assert "valid integer" in caught.value.reason


def test_a_newer_workers_schema_is_enforced_once_the_cached_one_is_older_than_the_ttl(
    memory_or_redis_store: Any, worker: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = memory_or_redis_store
    monkeypatch.setattr(params_check, "SCHEMA_TTL", 3600.0)
    client = Client(store)
    client.submit("echo", {"x": 1})  # reads and caches the first release's schema
    upgraded = Controller(store, app=newer)
    upgraded.start()  # the newer release of the app publishes its echo: it takes a name too
    try:
        assert "name" in published(store, "echo")["required"]
        client.submit("echo", {"x": 2})  # within the TTL: the copy it read
        with pytest.raises(InvalidParams) as fresh:
            Client(store).submit("echo", {"x": 3})  # a new client reads the newer one
        assert fresh.value.field == "name"
        monkeypatch.setattr(params_check, "SCHEMA_TTL", 0.0)  # the copy is now too old
        with pytest.raises(InvalidParams) as later:
            client.submit("echo", {"x": 4})
        assert later.value.field == "name"
        client.submit("echo", {"x": 5, "name": "five"})
        assert sorted(t.params["x"] for t in client.list()) == [1, 2, 5]
    finally:
        upgraded.shutdown(grace=5)


def test_a_schema_no_validator_compiles_is_a_corrupt_record_and_writes_nothing() -> None:
    from chongming_redis.stores.memory import InMemoryTaskStore

    store = InMemoryTaskStore()
    store.record_task_schemas({"echo": '{"type": 5}'}, now=_now(store))  # a foreign writer's
    client = Client(store)
    with pytest.raises(CorruptRecord, match="not a JSON Schema"):
        client.submit("echo", {"x": 1})
    assert client.list() == []
    client.submit("other", {"x": 1})  # another type is not affected


def test_what_the_workers_model_takes_is_never_refused_and_what_it_refuses_is() -> None:
    """pydantic's lax mode takes ``bytes`` for a ``bytes`` field, repeated items for a ``set``
    and ``True`` for a number, which plain JSON Schema would refuse: a producer without the
    app takes them too, and still refuses what the model refuses."""
    from pydantic import BaseModel

    from chongming_redis.stores.memory import InMemoryTaskStore

    class Lax(BaseModel):
        x: int
        ratio: float = 0.0
        ids: set[int] = set()
        blob: bytes = b""
        flag: bool = False

    store = InMemoryTaskStore()
    store.record_task_schemas({"lax": json.dumps(Lax.model_json_schema())}, now=_now(store))
    client = Client(store)
    taken = [{"x": 1, "blob": b"\x00\xff"}, {"x": 1, "ids": [1, 1]}, {"x": True, "ratio": True},
             {"x": 2.0, "flag": True}]  # fmt: skip
    for params in taken:
        Lax.model_validate(params)  # the worker takes them
        client.submit("lax", params)
    refused = {"x": "nope"}, {"x": 1, "flag": 3}, {"x": 1, "ids": ["a"]}, {"x": 1, "blob": 5}
    for params in refused:
        with pytest.raises(ValueError):
            Lax.model_validate(params)  # the worker refuses them
        with pytest.raises(InvalidParams):
            client.submit("lax", params)
    assert len(client.list()) == len(taken)


def test_a_store_without_the_extension_stores_params_as_given(tmp_path: Any) -> None:
    from tests.json_file_store import JsonFileTaskStore

    store = JsonFileTaskStore(tmp_path / "tasks.json")  # the 14 protocol methods only
    assert not isinstance(store, TaskSchemasStore)
    worker = Controller(store, app=app)
    worker.start()  # publishes nothing: nowhere to
    try:
        handle = Client(store).submit("echo", {"x": "not-an-int"})
        assert store.get(handle.task_id).params == {"x": "not-an-int"}  # type: ignore[union-attr]
    finally:
        worker.shutdown(grace=5)


@pytest.mark.redis
def test_the_async_client_checks_against_the_published_schema(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    controller = Controller(store, app=app, start_poll_interval=0.05)
    controller.start()

    async def body() -> None:
        async with AsyncClient.from_url(redis_proc.url, namespace=namespace) as client:
            with pytest.raises(InvalidParams) as caught:
                await client.submit("echo", {"x": 1, "size": {"width": 1.5}}, task_id="t-bad")
            assert caught.value.field == "size.width"
            with pytest.raises(InvalidParams):
                await client.submit_many("echo", [{"x": 1}, {"y": 2}])
            assert await client.get("t-bad") is None and await client.list() == []
            handle = await client.submit("echo", {"x": 9})
            assert await handle.wait(timeout=20) == {"x": 9, "size": None}
            assert await (await client.submit("free", ["any"])).wait(timeout=20) == ["any"]

    try:
        asyncio.run(body())
    finally:
        controller.shutdown(grace=5)
        store.close()


@pytest.mark.redis
def test_the_async_client_on_a_cluster_reads_the_schemas_from_the_namespaces_slot(
    redis_cluster: Any, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
    worker = Controller(store, app=app)
    worker.start()
    worker.shutdown(grace=5)  # the schemas stay

    async def body() -> None:
        made = AsyncClient.from_url(redis_cluster.url, namespace=namespace, cluster=True)
        async with made as client:
            with pytest.raises(InvalidParams) as caught:
                await client.submit("echo", {"x": [1]}, task_id="t-bad")
            assert caught.value.field == "x"
            assert await client.get("t-bad") is None
            assert (await client.submit("echo", {"x": 1}, task_id="t-ok")).task_id == "t-ok"

    try:
        asyncio.run(body())
        assert store.get("t-ok") is not None and store.get("t-bad") is None
    finally:
        store.drop_namespace()
        store.close()


# -- real worker processes -----------------------------------------------------------------------


def start_worker(target: StoreTarget, app_spec: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    return subprocess.Popen(
        [sys.executable, "-m", "chongming_redis.cli", "worker", app_spec, *target.cli_args()],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGINT)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(10)


def wait_until(predicate: Callable[[], bool], worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert worker.poll() is None, f"the worker exited with {worker.returncode}"
        assert time.monotonic() < deadline, "the worker published nothing"
        time.sleep(0.05)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", STORE_KINDS, indirect=True)
def test_a_producer_on_a_url_alone_checks_what_real_workers_published(
    target: StoreTarget,
) -> None:
    reader = target.open()
    worker = start_worker(target, "tests.support.schema_app:app")
    try:
        wait_until(lambda: "echo" in reader.task_schemas(), worker)
        with Client.from_url(target.url, namespace=target.namespace) as client:
            with pytest.raises(InvalidParams) as caught:
                client.submit("echo", {"x": "not-an-int"})
            assert caught.value.field == "x"
            assert client.list() == []
            assert client.submit("echo", {"x": 1}).wait(timeout=30) == {"x": 1, "size": None}
            assert client.submit("free", {"k": ["v"]}).wait(timeout=30) == {"k": ["v"]}
        stop(worker)
        before = reader.task_schemas(["echo"])["echo"]
        worker = start_worker(target, "tests.support.schema_app:newer")
        wait_until(lambda: reader.task_schemas(["echo"])["echo"] != before, worker)
        with Client.from_url(target.url, namespace=target.namespace) as client:
            with pytest.raises(InvalidParams) as changed:
                client.submit("echo", {"x": 2})
            assert changed.value.field == "name"
            done = client.submit("echo", {"x": 2, "name": "two"}).wait(timeout=30)
            assert done == {"x": 2, "name": "two"}
            assert {t.status for t in client.list()} == {TaskStatus.SUCCEEDED}
    finally:
        stop(worker)
        reader.close()


def test_the_cli_refuses_a_schedule_whose_params_the_schema_refuses(tmp_path: Any) -> None:
    from chongming_redis.stores.sqlite import SqliteTaskStore

    path = tmp_path / "tasks.sqlite3"
    store = SqliteTaskStore(path)
    worker = Controller(store, app=app)
    worker.start()  # publishes; the schemas stay once it is gone
    worker.shutdown(grace=5)
    store.close()
    where = ("--store", f"sqlite://{path}")
    refused = cli("schedules", "upsert", "nightly", "echo", "--params", '{"x": "ten"}',
                  "--every", "60", *where)  # fmt: skip
    user_error(refused, "'echo'", "x: 'ten' is not of type 'integer'")
    assert "nightly" not in ok(cli("schedules", "list", "--json", *where))
    created = cli("schedules", "upsert", "nightly", "echo", "--params", '{"x": 10}',
                  "--every", "60", *where)  # fmt: skip
    assert "created" in ok(created)


def _now(store: Any) -> Any:
    return store.server_time()
