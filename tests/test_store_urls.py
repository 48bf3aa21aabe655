"""A store from a URL (``chongming_redis/stores/urls.py``) and the CLI's ``--store``.

1. Parsing: every accepted form and what it opens; every refused one is a ``StoreUrlError`` (a
   ``ValueError``) that reads nothing and creates nothing, and never shows a password.
2. Opening: Redis in its namespace, a SQLite file (one namespace: ``default``), PostgreSQL in
   the namespace's schema (two namespaces are two schemas); each store's module is imported only
   when its URL is opened (a Redis user never imports psycopg).
3. The CLI: ``--store`` beside ``--redis`` (both given: one usage error; the command line beats
   the environment), a bad URL or namespace is one ``error:`` line, exit 1, nothing created.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from chongming_redis.embedded.postgres_server import PostgresProc
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.urls import (
    StoreUrlError,
    open_store_url,
    parse_store_url,
    shown_url,
)
from tests.support.redis_server import RedisProc, free_port
from tests.test_cli import APP, ROOT, cli, ok, user_error

pytestmark = pytest.mark.timeout(120)


def snapshot(task_id: str) -> TaskSnapshot:
    now = datetime.now(timezone.utc)
    return TaskSnapshot(task_id, "work", TaskStatus.PENDING, 1, now, now)


# -- 1. parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:6379/0", "redis"),
        ("rediss://user:pw@host:6380/1", "redis"),
        ("unix:///run/redis.sock?db=2", "redis"),
        ("REDIS://127.0.0.1", "redis"),
        ("postgresql://app@127.0.0.1:5432/app", "postgresql"),
        ("postgres://app@db/app?sslmode=require&connect_timeout=3", "postgresql"),
        ("sqlite:///var/lib/app/tasks.sqlite3", "sqlite"),
        ("sqlite:tasks.sqlite3", "sqlite"),
    ],
)
def test_each_scheme_names_its_store(url: str, kind: str) -> None:
    target = parse_store_url(url)
    assert (target.kind, target.url) == (kind, url)
    assert target.has_namespaces is (kind != "sqlite")
    assert target.module == {"redis": "chongming_redis.stores.redis",
                             "sqlite": "chongming_redis.stores.sqlite",
                             "postgresql": "chongming_redis.stores.postgres"}[kind]  # fmt: skip


def test_sqlite_paths_absolute_relative_and_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_store_url("sqlite:///var/lib/app/t.db").path == "/var/lib/app/t.db"
    assert parse_store_url("sqlite:data/t.db").path == str(tmp_path / "data" / "t.db")
    assert parse_store_url("sqlite:///tmp/a%20b%23c.db").path == "/tmp/a b#c.db"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("sqlite://", "in-memory"),
        ("sqlite:", "in-memory"),
        ("sqlite:///", "in-memory"),
        ("sqlite::memory:", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite://host/tasks.db", "not a host"),
        ("sqlite:///tmp/t.db?mode=ro", "no query"),
        ("sqlite:///tmp/t.db#x", "no query"),
        ("sqlite:file:t.db", "not a file: URI"),
        ("sqlite:///tmp/a%00b.db", "NUL"),
        ("postgresql://h/db?schema=app", "the schema is the namespace"),
        ("http://example.com/", "unknown store URL"),
        ("/var/lib/app/tasks.sqlite3", "unknown store URL"),
        ("", "unknown store URL"),
        ("mysql://u@h/db", "expected redis://"),
    ],
)
def test_bad_urls_are_refused_before_anything_is_opened(url: str, fragment: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        parse_store_url(url)
    assert isinstance(caught.value, ValueError)
    assert fragment in str(caught.value), str(caught.value)


def test_a_refused_url_never_shows_its_password() -> None:
    for url in ("mysql://app:s3cret@db:3306/app", "postgresql://app:s3cret@db/app?schema=x"):
        with pytest.raises(StoreUrlError) as caught:
            parse_store_url(url)
        assert "s3cret" not in str(caught.value) and "app:***@db" in str(caught.value)
    assert shown_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert shown_url("redis://u:pw@h:notaport/0") == "redis:..."  # unparsable: the scheme only


def test_a_url_that_is_not_a_str_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        parse_store_url(b"redis://127.0.0.1")
    with pytest.raises(TypeError):
        parse_store_url("sqlite:///tmp/t.db").check_namespace(None)


def test_a_sqlite_file_holds_one_namespace(tmp_path: Path) -> None:
    target = parse_store_url(f"sqlite://{tmp_path / 't.db'}")
    assert target.check_namespace("default") == "default"
    with pytest.raises(StoreUrlError, match="one file per namespace"):
        target.check_namespace("other")
    with pytest.raises(StoreUrlError, match="one file per namespace"):
        open_store_url(target.url, namespace="other")
    assert list(tmp_path.iterdir()) == []  # refused before the file was created
    assert parse_store_url("redis://h").check_namespace("other") == "other"


# -- 2. opening ---------------------------------------------------------------------------------


def test_sqlite_opens_the_file_and_must_exist_creates_nothing(tmp_path: Path) -> None:
    from chongming_redis.stores.sqlite import SqliteTaskStore

    url = f"sqlite://{tmp_path / 'tasks.db'}"
    with pytest.raises(StoreUrlError, match="no SQLite database at"):
        open_store_url(url, must_exist=True)
    assert list(tmp_path.iterdir()) == []
    writer = open_store_url(url)
    assert isinstance(writer, SqliteTaskStore)
    writer.create(snapshot("t1"))
    reader = open_store_url(url, must_exist=True)
    assert reader.get("t1") is not None
    writer.close()
    reader.close()


def test_redis_opens_in_the_namespace(redis_proc: RedisProc, namespace: str) -> None:
    from chongming_redis.stores.redis import RedisTaskStore

    store = open_store_url(redis_proc.url, namespace=namespace, redis_options={"retries": 0})
    assert isinstance(store, RedisTaskStore) and store.namespace == namespace
    store.create(snapshot("t1"))
    other = open_store_url(redis_proc.url, namespace=namespace + "-other")
    assert other.get("t1") is None
    store.close()
    other.close()


@pytest.fixture
def schemas(postgres_proc: PostgresProc) -> Iterator[list[str]]:
    """Schemas a test makes, dropped afterwards."""
    made: list[str] = []
    yield made
    for schema in made:
        store = open_store_url(postgres_proc.dsn, namespace=schema)
        store.drop_schema()  # type: ignore[attr-defined]
        store.close()


def test_postgresql_opens_the_namespace_as_its_schema(
    postgres_proc: PostgresProc, schemas: list[str]
) -> None:
    from chongming_redis.stores.postgres import PostgresTaskStore

    schemas += ["urls_a", "urls_b"]
    first = open_store_url(postgres_proc.dsn, namespace="urls_a")
    second = open_store_url(postgres_proc.dsn, namespace="urls_b")
    assert isinstance(first, PostgresTaskStore) and first.schema == "urls_a"
    first.create(snapshot("t1"))
    assert second.get("t1") is None  # two namespaces, two schemas
    again = PostgresTaskStore(postgres_proc.dsn, schema="urls_a")  # the same as the Python API
    assert again.get("t1") is not None
    for store in (first, second, again):
        store.close()


def test_a_client_from_any_store_url(tmp_path: Path, postgres_proc: PostgresProc) -> None:
    """``Client.from_url`` opens what ``open_store_url`` opens; Redis options are refused for
    another store (never silently dropped)."""
    from chongming_redis import Client
    from tests.support.pool_app import app

    for url, namespace in ((f"sqlite://{tmp_path / 't.db'}", "default"),
                           (postgres_proc.dsn, "urls_client")):  # fmt: skip
        with Client.from_url(url, namespace=namespace, app=app, num_buckets=8) as client:
            handle = client.submit("work", {"ms": 1})
            assert client.get(handle.task_id) is not None
        with pytest.raises(TypeError, match="store options are for a Redis URL"):
            Client.from_url(url, namespace=namespace, socket_timeout=1)
    store = open_store_url(postgres_proc.dsn, namespace="urls_client")
    store.drop_schema()  # type: ignore[attr-defined]
    store.close()


def test_a_redis_user_never_imports_the_sql_stores(redis_proc: RedisProc) -> None:
    """The CLI and ``open_store_url`` on a Redis URL: psycopg and the SQL store modules stay
    unimported (they are imported only when their URL is opened)."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules if m.startswith("
        "('psycopg', 'chongming_redis.stores.sqlite', 'chongming_redis.stores.postgres', "
        "'chongming_redis.stores._sql')))))\n"
        "from chongming_redis.stores.urls import open_store_url\n"
        f"open_store_url({redis_proc.url!r}, namespace='imports').counts()\n"
        f"sys.argv = ['chongming-redis', 'tasks', '--redis', {redis_proc.url!r}]\n"
        "from chongming_redis.cli import main\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


# -- 3. the CLI ---------------------------------------------------------------------------------


def test_redis_and_store_together_are_one_usage_error(
    redis_proc: RedisProc, tmp_path: Path
) -> None:
    database = tmp_path / "t.db"
    sqlite = f"sqlite://{database}"
    user_error(cli("tasks", f"--redis={redis_proc.url}", f"--store={sqlite}"),
               "--redis and --store name the same store: give one (both given)")  # fmt: skip
    env = {"CHONGMING_REDIS_URL": redis_proc.url, "CHONGMING_STORE_URL": sqlite}
    user_error(cli("tasks", env=env), "CHONGMING_REDIS_URL and CHONGMING_STORE_URL are both set")
    assert not database.exists()


def test_the_command_line_beats_the_environment(
    redis_proc: RedisProc, namespace: str, tmp_path: Path
) -> None:
    sqlite = f"sqlite://{tmp_path / 't.db'}"
    # CHONGMING_REDIS_URL exported, --store given: the SQLite file.
    out = ok(cli("submit", APP, "work", f"--store={sqlite}",
                 env={"CHONGMING_REDIS_URL": redis_proc.url}))  # fmt: skip
    (task_id,) = out.split()
    shown = ok(cli("show", task_id, "--json", env={"CHONGMING_STORE_URL": sqlite}))
    assert task_id in shown
    # CHONGMING_STORE_URL exported, --redis given: the Redis.
    env = {"CHONGMING_STORE_URL": sqlite}
    (on_redis,) = ok(cli("submit", APP, "work", f"--redis={redis_proc.url}",
                         f"--namespace={namespace}", env=env)).split()  # fmt: skip
    user_error(cli("show", on_redis, env=env), "no task")
    assert on_redis in ok(cli("show", on_redis, f"--redis={redis_proc.url}",
                              f"--namespace={namespace}", "--json"))  # fmt: skip


def test_bad_store_urls_and_namespaces_are_one_line_and_create_nothing(tmp_path: Path) -> None:
    database = tmp_path / "t.db"
    sqlite = f"sqlite://{database}"
    user_error(cli("tasks", "--redis", sqlite), "bad Redis URL", "give other stores with --store")
    user_error(cli("tasks", "--store=http://x/"), "unknown store URL 'http://x/'")
    user_error(cli("tasks", "--store=sqlite::memory:"), "in-memory database")
    user_error(cli("tasks", f"--store={sqlite}"), f"no SQLite database at {database}")
    user_error(cli("worker", APP, f"--store={sqlite}", "--namespace=other"),
               "one file per namespace")  # fmt: skip
    user_error(cli("submit", "no_such_mod_zz:app", "work", f"--store={sqlite}"),
               "cannot import 'no_such_mod_zz'")  # fmt: skip
    user_error(cli("worker", APP, "--store=bogus://x", "--processes=2"), "unknown store URL")
    user_error(cli("tasks", "--store=postgresql://h/db?schema=x"), "the schema is the namespace")
    assert list(tmp_path.iterdir()) == []


def test_a_postgresql_that_is_down_is_one_line() -> None:
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/app?connect_timeout=1"
    user_error(cli("tasks", f"--store={url}"), "127.0.0.1")


def test_read_commands_on_sqlite(tmp_path: Path) -> None:
    """The read commands on a SQLite file; an empty one says where it looked."""
    from chongming_redis.stores.sqlite import SqliteTaskStore

    empty = tmp_path / "empty.db"
    SqliteTaskStore(empty).close()
    assert ok(cli("tasks", f"--store=sqlite://{empty}")).strip() == (
        f"SQLite database {empty} has no tasks")  # fmt: skip
    sqlite = f"sqlite://{tmp_path / 't.db'}"
    (task_id,) = ok(cli("submit", APP, "work", f"--store={sqlite}")).split()
    assert task_id in ok(cli("tasks", f"--store={sqlite}", wide=True))
    assert "pending" in ok(cli("stats", f"--store={sqlite}"))
    assert task_id in ok(cli("changes", "--after=0", f"--store={sqlite}"))
    assert "pruned 0 task(s)" in ok(cli("prune", f"--store={sqlite}"))


def test_a_redis_database_that_is_not_a_number_is_refused_not_read_as_zero() -> None:
    from chongming_redis.stores.redis import RedisTaskStore

    for bad in ("redis://127.0.0.1:6379/abc", "rediss://127.0.0.1:6380/1x"):
        with pytest.raises(ValueError, match="the database must be a number"):
            RedisTaskStore.from_url(bad, namespace="n", check_server=False)
        user_error(cli("stats", "--redis", bad), "the database must be a number")
    from chongming_redis.stores._redis.connect import connect

    for good, db in (("redis://127.0.0.1:6379", 0), ("redis://h:6379/", 0), ("redis://h/3", 3)):
        client = connect(good, socket_timeout=1, socket_connect_timeout=1, retries=0)  # no I/O
        assert client.connection_pool.connection_kwargs.get("db", 0) == db


def test_a_worker_refuses_processes_below_one() -> None:
    for count in ("0", "-2"):
        user_error(cli("worker", APP, "--processes", count, "--redis", "redis://127.0.0.1:1/0"),
                   "--processes must be at least 1")  # fmt: skip
