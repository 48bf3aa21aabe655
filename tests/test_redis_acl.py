"""F19 / SPEC §3 least privilege: the store works as an ACL user restricted to its namespace.

The store user of a namespace ``ns`` is created with exactly::

    ACL SETUSER <user> on >pw resetkeys ~{ns}:* resetchannels +@all -@admin -@dangerous \
        &{ns}:nudge:*

(the key pattern is ``Keys(ns).pattern()``, glob-escaped). That is enough for every protocol
method: the scripts run with ``EVALSHA``/``EVALSHA_RO`` (``@scripting``), ``NOSCRIPT`` is
answered with ``SCRIPT LOAD`` (``@scripting``, not ``@admin``/``@dangerous``), reads are
``HGETALL``/``ZRANGEBYSCORE``; ``HELLO`` is always allowed. ``INFO`` is ``@dangerous`` in Redis
7, so the start-up durability check is denied and skipped with an info log line; that one
``info`` entry per store user is the only ``ACL LOG`` entry the whole contract produces. The one
channel pattern granted is the namespace's nudges, ``&{ns}:nudge:*`` (``Keys.channel_pattern``):
a create publishes ``{ns}:nudge:work`` so idle workers wake in the same round trip. A user
without it still creates (the publish is best effort; the denial is logged) — tested below.

The whole ``StoreContract`` runs as such users, one user per namespace created on demand in
``make_store`` (so a store cannot even read its neighbours). A canary ``other:canary`` and a
task key of another namespace, written by the default user first, are byte-identical after every
test, and the ``ACL LOG`` holds nothing from the store users but that ``info`` probe. The
contract runs a second time as users granted no category at all, only single commands
(``STORE_USER_EXPLICIT``: what the Python side sends plus what the scripts spell).

A read-only user can ``get``, ``query``, ``counts`` and ``history``; every write raises a
``StoreError`` wrapping the ``NOPERM`` and leaves the namespace byte-identical. The minimal
read-only set (found by denial, see ``READ_ONLY_EXACT``) is what the store sends (``HGETALL``,
``ZRANGEBYSCORE``), what its query script adds (``HKEYS``, ``HMGET``, ``TYPE``, ``ZCARD``,
``ZREVRANGEBYSCORE``, ...), ``EVALSHA_RO`` and ``SCRIPT LOAD``; the category form
``-@all +@read -@dangerous +evalsha_ro +script|load`` works too. ``SCRIPT LOAD`` is allowed so
the store answers ``NOSCRIPT`` itself (after a restart or a ``SCRIPT FLUSH``); a deployment
that does not want it must pre-load ``lua/query.lua`` as an admin, which is tested as well.

Finally the sources are searched for admin commands (``KEYS``, ``FLUSHDB``, ``FLUSHALL``,
``CONFIG SET``, ``SCRIPT FLUSH``): there are none, and the ACL above would refuse them anyway.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis

from chongming_redis import (
    Command,
    CommandKind,
    Progress,
    StoreError,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores._redis.scripts import script_text
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.testing.store_contract import StoreContract
from tests.support.fixtures import require_redis_server
from tests.support.redis_server import RedisProc

pytestmark = pytest.mark.redis

PASSWORD = "f19-secret"
#: Everything but the key pattern: what a namespace's store user is granted.
STORE_USER_RULES = ("resetchannels", "+@all", "-@admin", "-@dangerous")
#: The minimal read-only set for get/query/counts/history, found by denial (ACL LOG): the
#: store's own reads, the commands of lua/query.lua, the read-only script call, and
#: SCRIPT LOAD for the NOSCRIPT fallback.
READ_ONLY_EXACT = (
    "-@all",
    "+hgetall",  # get; query's replies, the counters it picks its source by
    "+zrangebyscore",  # history; query's ascending walk
    "+zrevrangebyscore",  # query's descending walk
    "+zrank",  # query: the next chunk of a source, after its last entry (ascending)
    "+zrange",
    "+zrevrank",  # the same, descending
    "+zrevrange",
    "+hkeys",  # query: names of a (status, bucket)
    "+zcard",  # query: a tag / pipeline index's size, weighed against the composite's counters
    "+hmget",  # counts (the status fields); query: the per-task filter check, a name count
    "+type",  # query: refuses an index or task of the wrong type
    "+evalsha_ro",
    "+script|load",
)
READ_ONLY_CATEGORIES = ("-@all", "+@read", "-@dangerous", "+evalsha_ro", "+script|load")

ROOT = Path(__file__).resolve().parents[1]
#: A command as the scripts spell it: called (``rcall``, ``redis.call``/``pcall``), read through
#: ``try_read`` (lib/common) or planned by ``dep_op`` (lib/dependencies, flushed by rcall).
_LUA_CALL = re.compile(r"""(?:rcall|redis\.p?call|try_read|dep_op)\(\s*['"]([A-Za-z]+)['"]""")


def lua_commands() -> set[str]:
    """Every Redis command the scripts of ``lua/`` spell (``_LUA_CALL``)."""
    text = "".join(p.read_text("utf-8") for p in sorted((ROOT / "lua").rglob("*.lua")))
    return {name.lower() for name in _LUA_CALL.findall(text)}


#: F19's explicit form: no category at all, only the commands the store sends from Python for
#: the 14 methods (script calls, the NOSCRIPT fallback, get/counts and history) and the
#: commands its scripts run (derived from lua/, so a new script command is granted, and shown
#: here, without editing this file).
PYTHON_SIDE_COMMANDS = {"evalsha", "evalsha_ro", "script|load", "hgetall", "zrangebyscore"}
STORE_USER_EXPLICIT = (
    "resetchannels",
    "-@all",
    *sorted("+" + c for c in PYTHON_SIDE_COMMANDS | lua_commands()),
)

CANARY_KEY, CANARY_VALUE = "other:canary", b"written by the default user"
#: A task of another namespace; no store user may touch it.
OTHER_TASK_KEY = "{acl-other}:t:t1"

T0 = datetime(2024, 3, 10, 12, 0, 0, tzinfo=timezone.utc)
SKIPPED_LINE = "server settings not checked: this user may not run INFO"


# -- helpers ---------------------------------------------------------------------------------


def add_user(
    admin: redis.Redis, user: str, namespace: str, rules: tuple[str, ...], *, nudges: bool = True
) -> None:
    """``ACL SETUSER <user> on >pw resetkeys <Keys(namespace).pattern()> <rules...>
    [<Keys(namespace).channel_pattern()>]`` (after ``resetchannels``: the nudge channels)."""
    keys = Keys(namespace)
    channels = (keys.channel_pattern(),) if nudges else ()
    admin.execute_command(
        "ACL", "SETUSER", user, "on", ">" + PASSWORD, "resetkeys", keys.pattern(), *rules,
        *channels,
    )  # fmt: skip


def store_as(server: RedisProc, user: str, namespace: str) -> RedisTaskStore:
    return RedisTaskStore.from_url(
        server.url, namespace=namespace, username=user, password=PASSWORD
    )


def denials(admin: redis.Redis, user: str) -> set[tuple[str, str]]:
    """``(reason, object)`` of every ``ACL LOG`` entry of ``user``."""
    entries = admin.execute_command("ACL", "LOG", "100000")
    found = set()
    for entry in entries:
        fields = _entry_fields(entry)
        if fields["username"] == user:
            found.add((fields["reason"], fields["object"]))
    return found


def _entry_fields(entry: Any) -> dict[str, str]:
    pairs = entry.items() if isinstance(entry, dict) else zip(entry[::2], entry[1::2])
    return {_str(k): _str(v) for k, v in pairs}


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def namespace_image(admin: redis.Redis, namespace: str) -> dict[bytes, tuple[bytes, bool]]:
    """Every key of the namespace with its ``DUMP`` and whether it has a TTL: equal images
    mean nothing in the namespace changed."""
    match = Keys(namespace).pattern()[1:]  # the same glob, without ACL's '~'
    image = {}
    for key in admin.scan_iter(match=match, count=1000):
        image[key] = (admin.dump(key), admin.pttl(key) >= 0)
    return image


def populate(store: TaskStore) -> None:
    for i, (name, status) in enumerate(
        [("job", TaskStatus.PENDING), ("job.b", TaskStatus.RUNNING), ("etl", TaskStatus.FAILED)]
    ):
        at = T0 + timedelta(seconds=i)
        store.create(
            TaskSnapshot(
                f"t{i}:ü",
                name,
                status,
                1,
                at,
                at,
                tags=frozenset({"io", f"tag{i}"}),
                bucket=i % 2,
                pipeline_run_id="run-1",
            )
        )
        store.append(Transition(f"t{i}:ü", 1, None, status, at))
    store.submit_command(Command("c1", "t0:ü", CommandKind.STOP, T0))


READ_QUERIES = (
    None,
    TaskQuery(newest_first=True),
    TaskQuery(statuses=frozenset({TaskStatus.PENDING, TaskStatus.FAILED})),
    TaskQuery(name="job"),
    TaskQuery(name_prefix="job", newest_first=True),
    TaskQuery(tag="io", limit=2),
    TaskQuery(pipeline_run_id="run-1", buckets=frozenset({1})),
)


def reads(store: TaskStore) -> list[object]:
    return [
        [store.get(f"t{i}:ü") for i in range(3)],
        store.get("missing"),
        [store.query(q) for q in READ_QUERIES],
        store.counts(),
        [store.history(f"t{i}:ü") for i in range(3)],
    ]


# -- the whole contract as a namespace-restricted user -----------------------------------------


class TestContractAsNamespaceRestrictedAclUser(StoreContract):
    """Every contract test, each on a fresh namespace with its own ACL user."""

    rules: ClassVar[tuple[str, ...]] = STORE_USER_RULES
    server: ClassVar[RedisProc]
    admin: ClassVar[redis.Redis]
    user: str

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _acl_server(cls) -> Iterator[None]:
        # A private server for the class (fresh_redis_proc is function-scoped, and one server
        # per contract test would cost a process start each): the test reconfigures it.
        require_redis_server()
        cls.server = RedisProc()
        cls.admin = cls.server.client()
        cls.admin.config_set("acllog-max-len", 100_000)  # the test's admin, not the store
        cls.admin.execute_command("ACL", "LOG", "RESET")
        cls.admin.set(CANARY_KEY, CANARY_VALUE)
        cls.admin.hset(OTHER_TASK_KEY, mapping={"n": "job", "s": "pending", "v": "1"})
        other_task = cls.admin.dump(OTHER_TASK_KEY)
        try:
            yield
            assert cls.admin.get(CANARY_KEY) == CANARY_VALUE
            assert cls.admin.dump(OTHER_TASK_KEY) == other_task
        finally:
            cls.admin.close()
            cls.server.close()

    def make_store(self) -> TaskStore:
        namespace = f"acl-{uuid.uuid4().hex[:12]}"
        self.user = f"store-{namespace}"
        add_user(self.admin, self.user, namespace, self.rules)
        return store_as(self.server, self.user, namespace)

    def teardown_method(self, method: object) -> None:
        super().teardown_method(method)
        assert self.admin.get(CANARY_KEY) == CANARY_VALUE
        # The only denial: the start-up INFO probe (durability check skipped, see below).
        assert denials(self.admin, self.user) == {("command", "info")}


class TestContractAsExplicitCommandListAclUser(TestContractAsNamespaceRestrictedAclUser):
    """The same, as a user granted single commands and no category (``STORE_USER_EXPLICIT``).
    Without any one of del, exists, hdel, hexists, hget, hincrby, pexpire, rpush, zcard,
    zcount, zrange, zadd, zrem or hset some contract tests fail (checked by removing each);
    lrange (a retried claim) and zremrangebyscore (pool_tick) are not reached by the contract."""

    rules = STORE_USER_EXPLICIT


def test_the_script_command_list_is_derived_from_the_sources() -> None:
    commands = lua_commands()
    assert {"evalsha", "hset", "zadd", "hgetall", "type"} - commands == {"evalsha"}
    assert not commands & {"keys", "flushdb", "flushall", "config", "script", "info", "scan"}


# -- the store user: start-up check, isolation ------------------------------------------------


def test_a_user_without_the_nudge_channel_still_creates_and_the_denial_is_logged(
    fresh_redis_proc: RedisProc,
) -> None:
    admin = fresh_redis_proc.client()
    add_user(admin, "store-quiet", "q", STORE_USER_RULES, nudges=False)
    store = store_as(fresh_redis_proc, "store-quiet", "q")
    store.create(TaskSnapshot("t1", "job", TaskStatus.PENDING, 1, T0, T0))
    store.commit_tasks([(TaskSnapshot("t2", "job", TaskStatus.PENDING, 1, T0, T0), None, [])])
    assert {t.task_id for t in store.query()} == {"t1", "t2"}
    assert store.counts()[TaskStatus.PENDING] == 2
    store.close()
    assert ("channel", "{q}:nudge:work") in denials(admin, "store-quiet")
    # Teeth: with the channel granted, the same creates are not denied.
    add_user(admin, "store-loud", "l", STORE_USER_RULES)
    store = store_as(fresh_redis_proc, "store-loud", "l")
    store.create(TaskSnapshot("t1", "job", TaskStatus.PENDING, 1, T0, T0))
    store.close()
    assert not any(reason == "channel" for reason, _ in denials(admin, "store-loud"))


def test_the_store_user_skips_the_durability_check_with_an_info_line(
    fresh_redis_proc: RedisProc, caplog: pytest.LogCaptureFixture
) -> None:
    admin = fresh_redis_proc.client()
    admin.config_set("appendonly", "no")  # a setting the check would warn about, if it ran
    add_user(admin, "store-a", "a", STORE_USER_RULES)
    caplog.set_level(logging.INFO, logger="chongming_redis.store")

    store = store_as(fresh_redis_proc, "store-a", "a")
    store.create(TaskSnapshot("t1", "job", TaskStatus.PENDING, 1, T0, T0))
    store.close()

    records = [r for r in caplog.records if r.name == "chongming_redis.store"]
    assert [(r.levelno, r.getMessage()) for r in records] == [(logging.INFO, SKIPPED_LINE)]
    assert denials(admin, "store-a") == {("command", "info")}

    # Teeth: where INFO is granted, the same store does check and warns.
    caplog.clear()
    add_user(admin, "store-b", "b", (*STORE_USER_RULES, "+info"))
    store_as(fresh_redis_proc, "store-b", "b").close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "appendonly is off" in warnings[0]
    assert SKIPPED_LINE not in caplog.text
    assert denials(admin, "store-b") == set()


def test_the_acl_is_real_the_store_user_reaches_nothing_outside_its_namespace(
    fresh_redis_proc: RedisProc,
) -> None:
    """Teeth for the contract run: the rules do refuse what the store must never do, and a
    store pointed at another namespace with these credentials writes nothing there."""
    admin = fresh_redis_proc.client()
    admin.set(CANARY_KEY, CANARY_VALUE)
    add_user(admin, "store-a", "a", STORE_USER_RULES)
    raw = fresh_redis_proc.client(username="store-a", password=PASSWORD)
    for command in (
        ("GET", CANARY_KEY),
        ("SET", CANARY_KEY, "x"),
        ("KEYS", "*"),
        ("FLUSHDB",),
        ("FLUSHALL",),
        ("CONFIG", "SET", "appendonly", "no"),
        ("PUBLISH", "{b}:nudge:work", "1"),  # another namespace's nudges
        ("PUBLISH", "{a}:other", "1"),  # its own namespace, but not a nudge channel
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            raw.execute_command(*command)
    raw.set("{a}:scratch", "own namespace is writable")
    raw.publish("{a}:nudge:work", "1")  # and its own nudges
    raw.close()

    populate(RedisTaskStore.from_url(fresh_redis_proc.url, namespace="b"))  # default user
    before = namespace_image(admin, "b")
    trespasser = store_as(fresh_redis_proc, "store-a", "b")
    for write in (
        lambda: trespasser.create(TaskSnapshot("t9", "job", TaskStatus.PENDING, 1, T0, T0)),
        lambda: trespasser.touch("t0:ü", heartbeat_at=T0),
        lambda: trespasser.claim_commands(now=T0, lease_seconds=5),
        lambda: trespasser.get("t0:ü"),
        lambda: trespasser.query(),
    ):
        with pytest.raises(StoreError):
            write()
    trespasser.close()
    assert namespace_image(admin, "b") == before
    assert admin.get(CANARY_KEY) == CANARY_VALUE
    assert {reason for reason, _ in denials(admin, "store-a")} <= {"command", "key", "channel"}


# -- a read-only user ------------------------------------------------------------------------


@pytest.mark.parametrize("rules", [READ_ONLY_EXACT, READ_ONLY_CATEGORIES], ids=["exact", "cats"])
def test_a_read_only_user_reads_everything_and_writes_nothing(
    fresh_redis_proc: RedisProc, rules: tuple[str, ...]
) -> None:
    admin = fresh_redis_proc.client()
    writer = RedisTaskStore.from_url(fresh_redis_proc.url, namespace="ro")
    populate(writer)
    expected = reads(writer)
    admin.script_flush()  # the reader's first query meets NOSCRIPT and must load it itself
    add_user(admin, "reader", "ro", rules)
    reader = store_as(fresh_redis_proc, "reader", "ro")
    assert not reader.legacy_scripts  # query goes through EVALSHA_RO

    assert reads(reader) == expected
    assert denials(admin, "reader") == {("command", "info")}

    before = namespace_image(admin, "ro")
    task = writer.get("t0:ü")
    assert task is not None
    writes = {
        "create": lambda: reader.create(TaskSnapshot("new", "job", TaskStatus.PENDING, 1, T0, T0)),
        "create existing": lambda: reader.create(task),
        "save": lambda: reader.save(
            TaskSnapshot("t0:ü", "job", TaskStatus.RUNNING, 2, T0, T0), expect_version=1
        ),
        "touch": lambda: reader.touch("t0:ü", progress=Progress(1, 2), heartbeat_at=T0),
        "touch lease": lambda: reader.touch("t0:ü", lease_owner="w", lease_until=T0),
        "claim_commands": lambda: reader.claim_commands(now=T0, lease_seconds=30),
        "append": lambda: reader.append(Transition("t0:ü", 2, None, TaskStatus.RUNNING, T0)),
        "submit_command": lambda: reader.submit_command(
            Command("c2", "t0:ü", CommandKind.PAUSE, T0)
        ),
        "complete_command": lambda: reader.complete_command("c1", now=T0),
        "release_command": lambda: reader.release_command("c1", now=T0),
        "prune": lambda: reader.prune(keep_terminal=0),
    }
    for name, write in writes.items():
        with pytest.raises(StoreError, match="no permissions") as caught:
            write()
        assert isinstance(caught.value.__cause__, redis.exceptions.NoPermissionError), name
        assert namespace_image(admin, "ro") == before, name
    assert reads(writer) == expected
    assert reads(reader) == expected
    # The deliberate negatives, and nothing else: the script call itself is refused, so no
    # key was ever reached.
    assert denials(admin, "reader") == {("command", "info"), ("command", "evalsha")}
    reader.close()
    writer.close()


def test_a_read_only_user_without_script_load_needs_the_query_script_preloaded(
    fresh_redis_proc: RedisProc,
) -> None:
    """The alternative to granting SCRIPT LOAD: an admin loads lua/query.lua beforehand."""
    admin = fresh_redis_proc.client()
    writer = RedisTaskStore.from_url(fresh_redis_proc.url, namespace="ro")
    populate(writer)
    expected = reads(writer)
    admin.script_flush()
    no_load = tuple(rule for rule in READ_ONLY_EXACT if rule != "+script|load")
    add_user(admin, "reader", "ro", no_load)
    reader = store_as(fresh_redis_proc, "reader", "ro")

    assert reader.get("t0:ü") == writer.get("t0:ü")  # plain reads need no script
    with pytest.raises(StoreError, match="script\\|load"):
        reader.query()
    admin.script_load(script_text("query"))  # the deployment's pre-load, as an admin
    assert reads(reader) == expected
    reader.close()
    writer.close()


# -- the sources never issue admin commands ------------------------------------------------------

ADMIN_CALLS = [
    # redis-py methods: KEYS takes a pattern (dict.keys() takes nothing)
    re.compile(r"\.(keys)\(\s*[^)\s]"),
    re.compile(r"\.(flushdb|flushall|config_set|script_flush)\("),
    # a command spelled as a string: execute_command("KEYS", ...), rcall('FLUSHALL'), ...
    re.compile(r"""["'](keys|flushdb|flushall)["']""", re.IGNORECASE),
    re.compile(r"""["']config["']\s*,\s*["']set["']""", re.IGNORECASE),
    re.compile(r"""["']script["']\s*,\s*["']flush["']""", re.IGNORECASE),
    re.compile(r"""["'](config\s+set|script\s+flush)""", re.IGNORECASE),
]


def admin_calls(text: str) -> list[str]:
    return [m.group(0) for pattern in ADMIN_CALLS for m in pattern.finditer(text)]


def test_the_admin_command_search_has_teeth() -> None:
    for bad in (
        'client.keys("job:*")',
        "r.keys(pattern)",
        "c.flushdb()",
        "c.flushall(asynchronous=True)",
        'c.config_set("maxmemory-policy", "noeviction")',
        "c.script_flush()",
        'c.execute_command("KEYS", "*")',
        'c.execute_command("CONFIG", "SET", "x", "y")',
        'c.execute_command("CONFIG SET", "x", "y")',
        'c.execute_command("SCRIPT", "FLUSH")',
        "redis.call('keys', ARGV[1])",
        "rcall('FLUSHALL')",
        'redis.pcall("FlushDB")',
    ):
        assert admin_calls(bad), bad
    for fine in ("fields.keys()", "for k in d.keys():", "rcall('HKEYS', key)", "# no KEYS"):
        assert not admin_calls(fine), fine


def test_the_store_sources_never_issue_admin_commands() -> None:
    sources = sorted((ROOT / "chongming_redis").rglob("*.py")) + sorted(
        (ROOT / "lua").rglob("*.lua")
    )
    assert len(sources) > 10 and any(p.suffix == ".lua" for p in sources)
    # The test cluster launcher administers the private servers it started (MIGRATE ... KEYS
    # moves a slot's keys); no store, runtime or tool code path reaches it.
    launchers = {ROOT / "chongming_redis" / "embedded" / "redis_cluster.py"}
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sources
        if path not in launchers and (hits := admin_calls(path.read_text("utf-8")))
    }
    assert found == {}
    assert all(p in sources for p in launchers)  # the exemption names a file that exists
