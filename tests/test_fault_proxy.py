"""FaultProxy: pass-through fidelity, and every toxic provably fires (RELIABILITY.md §0.2, F7-F9).

The negative controls here are the point of F7: with redis-py's default retry policy a lost reply
makes the client silently run a non-idempotent command twice (RELIABILITY.md fact 2).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from chongming_redis.stress.fault_proxy import FaultProxy, parse_request, reply_end
from tests.support.redis_server import RedisProc

pytestmark = pytest.mark.timeout(10)

ClientFactory = Callable[..., redis.Redis]


@pytest.fixture
def proxy(redis_proc: RedisProc) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", redis_proc.port) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def clients() -> Iterator[ClientFactory]:
    """Make redis-py clients that are all closed at teardown (no unclosed-socket warnings)."""
    made: list[redis.Redis] = []

    def make(**options: object) -> redis.Redis:
        client = redis.Redis(**options)  # type: ignore[arg-type]
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def direct(redis_proc: RedisProc, clients: ClientFactory) -> redis.Redis:
    """A client straight to Redis (not through the proxy): the ground truth."""
    return clients(port=redis_proc.port, socket_timeout=5)


def no_retry(clients: ClientFactory, proxy: FaultProxy, **options: object) -> redis.Redis:
    # redis-py 8: retry=None leaves the connection with Retry(NoBackoff(), 0), i.e. one attempt.
    options.setdefault("socket_timeout", 5)
    return clients(port=proxy.port, retry=None, **options)


def incr(client: redis.Redis, key: str) -> int:
    # redis-py's ``Redis.incr`` sends INCRBY; the toxics below match the plain INCR command.
    return int(client.execute_command("INCR", key))


# ----------------------------------------------------------------------------- parsers


def test_parse_request_handles_partial_pipelined_and_inline_input() -> None:
    one = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
    assert parse_request(one) == (len(one), b"GET")
    for cut in range(len(one)):
        assert parse_request(one[:cut]) is None
    two = one + b"*1\r\n$4\r\nping\r\n"
    end, name = parse_request(two)  # type: ignore[misc]
    assert name == b"GET"
    assert parse_request(two, end) == (len(two), b"PING")
    assert parse_request(b"ping\r\n") == (6, b"PING")
    assert parse_request(b"\r\n") == (2, None)
    assert parse_request(b"*0\r\n") == (4, None)
    binary = b"*2\r\n$4\r\nECHO\r\n$4\r\n\r\n\r\n\r\n"  # CRLF inside a bulk string
    assert parse_request(binary) == (len(binary), b"ECHO")


def test_reply_end_handles_resp2_resp3_and_partial_replies() -> None:
    replies = [
        b"+OK\r\n",
        b"-ERR x\r\n",
        b":42\r\n",
        b"$-1\r\n",
        b"$5\r\nhe\r\no\r\n",
        b"*-1\r\n",
        b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
        b"_\r\n",
        b",1.5\r\n",
        b"#t\r\n",
        b"(123\r\n",
        b"!3\r\nerr\r\n",
        b"=7\r\ntxt:abc\r\n",
        b"%1\r\n+k\r\n*0\r\n",
        b"~2\r\n:1\r\n:2\r\n",
        b">2\r\n+a\r\n+b\r\n",
        b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n",  # attribute, then the value it annotates
    ]
    for reply in replies:
        assert reply_end(reply) == len(reply), reply
        assert reply_end(reply + b"+next\r\n") == len(reply), reply
        for cut in range(len(reply)):
            assert reply_end(reply[:cut]) is None, (reply, cut)


def test_only_loopback_upstreams_are_accepted() -> None:
    with pytest.raises(ValueError):
        FaultProxy("10.0.0.1", 6379)


# ----------------------------------------------------------------------------- pass-through


@pytest.mark.redis
def test_pass_through_set_get_pipeline_and_large_value(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    client = no_retry(clients, proxy)
    assert client.set(f"{namespace}:a", "1")
    assert client.get(f"{namespace}:a") == b"1"

    pipe = client.pipeline(transaction=False)
    for i in range(1000):
        pipe.set(f"{namespace}:p:{i}", i)
    for i in range(1000):
        pipe.get(f"{namespace}:p:{i}")
    results = pipe.execute()
    assert results[:1000] == [True] * 1000
    assert results[1000:] == [str(i).encode() for i in range(1000)]

    big = bytes(range(256)) * 4096  # 1 MiB, every byte value including \r\n
    assert client.set(f"{namespace}:big", big)
    assert client.get(f"{namespace}:big") == big
    assert direct.get(f"{namespace}:big") == big

    with client.pipeline(transaction=True) as tx:
        tx.execute_command("INCR", f"{namespace}:tx")
        tx.execute_command("INCR", f"{namespace}:tx")
        assert tx.execute() == [1, 2]

    seen = proxy.commands_seen
    assert seen["SET"] == 1002 and seen["GET"] == 1002
    assert seen["MULTI"] == 1 and seen["EXEC"] == 1 and seen["INCR"] == 2
    assert proxy.fired == {}


@pytest.mark.redis
def test_raw_requests_split_across_reads_and_pipelined(proxy: FaultProxy) -> None:
    request = b"*2\r\n$4\r\nECHO\r\n$5\r\nhello\r\n"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in request:  # one byte per TCP write
            sock.sendall(bytes([byte]))
            time.sleep(0.001)
        sock.sendall(request + b"PING\r\n" + request)  # pipelined, with an inline command
        expected = b"$5\r\nhello\r\n" + b"$5\r\nhello\r\n+PONG\r\n$5\r\nhello\r\n"
        received = b""
        while len(received) < len(expected):
            chunk = sock.recv(4096)
            assert chunk, "proxy closed the connection"
            received += chunk
    assert received == expected
    seen = proxy.commands_seen
    assert seen["ECHO"] == 3 and seen["PING"] == 1


@pytest.mark.redis
def test_resp3_pass_through(proxy: FaultProxy, clients: ClientFactory, namespace: str) -> None:
    client = no_retry(clients, proxy, protocol=3)
    client.hset(f"{namespace}:h", mapping={"a": "1", "b": "2"})
    assert client.hgetall(f"{namespace}:h") == {b"a": b"1", b"b": b"2"}
    assert proxy.commands_seen["HELLO"] == 1


# ----------------------------------------------------------------------------- drop_reply_of


@pytest.mark.redis
def test_drop_reply_without_retry_is_an_ambiguous_failure(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    key = f"{namespace}:n"
    client = no_retry(clients, proxy)
    toxic = proxy.drop_reply_of("incr", nth=3)
    assert incr(client, key) == 1
    assert incr(client, key) == 2
    with pytest.raises(redis.ConnectionError):
        incr(client, key)
    # The client learned nothing, but the INCR ran.
    assert direct.get(key) == b"3"
    assert toxic.fired == 1 and proxy.fired["drop_reply_of"] == 1
    # The toxic fires once; the client reconnects on its next call.
    assert incr(client, key) == 4
    assert incr(client, key) == 5
    assert toxic.fired == 1 and proxy.commands_seen["INCR"] == 5


@pytest.mark.redis
def test_drop_reply_counts_occurrences_across_connections(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    key = f"{namespace}:n"
    first, second = no_retry(clients, proxy), no_retry(clients, proxy)
    first.ping()
    second.ping()
    toxic = proxy.drop_reply_of("INCR", nth=2)
    assert incr(first, key) == 1
    with pytest.raises(redis.ConnectionError):
        incr(second, key)
    assert incr(first, key) == 3  # the other connection is untouched
    assert direct.get(key) == b"3"
    assert toxic.fired == 1


@pytest.mark.redis
def test_drop_reply_inside_a_pipeline_delivers_nothing_after_it(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    client = no_retry(clients, proxy)
    toxic = proxy.drop_reply_of("INCR", nth=50)
    pipe = client.pipeline(transaction=False)
    for _ in range(100):
        pipe.execute_command("INCR", f"{namespace}:n")
    with pytest.raises(redis.ConnectionError):
        pipe.execute()
    assert toxic.fired == 1
    # Every pipelined INCR reached Redis (they were sent before the reset).
    assert int(direct.get(f"{namespace}:n") or 0) == 100


@pytest.mark.redis
def test_drop_reply_with_resp3(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    client = no_retry(clients, proxy, protocol=3)
    toxic = proxy.drop_reply_of("INCR", nth=1)
    with pytest.raises(redis.ConnectionError):
        incr(client, f"{namespace}:n")
    assert direct.get(f"{namespace}:n") == b"1"
    assert toxic.fired == 1


@pytest.mark.redis
def test_negative_control_default_retry_double_executes_incr(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    """RELIABILITY.md fact 2: redis-py's default retry silently re-runs a command whose reply
    was lost. 5 INCR calls, no error seen by the caller, counter ends at 6."""
    key = f"{namespace}:n"
    client = clients(port=proxy.port, socket_timeout=5)  # redis-py's default retry policy
    toxic = proxy.drop_reply_of("INCR", nth=3)
    returned = [incr(client, key) for _ in range(5)]
    assert toxic.fired == 1
    assert returned == [1, 2, 4, 5, 6]  # the 3rd call's first execution is invisible
    assert direct.get(key) == b"6"  # one more than the 5 calls made: a double execution
    assert proxy.commands_seen["INCR"] == 6


@pytest.mark.redis
def test_negative_control_default_retry_double_executes_evalsha(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    """Same for a (non-idempotent) Lua script called by EVALSHA: why our scripts must
    recognise an already-applied write."""
    key = f"{namespace}:n"
    source = "return redis.call('INCR', KEYS[1])"
    direct.script_load(source)  # so the proxied client never sees NOSCRIPT
    client = clients(port=proxy.port, socket_timeout=5)
    script = client.register_script(source)
    toxic = proxy.drop_reply_of("EVALSHA", nth=2)
    returned = [script(keys=[key]) for _ in range(3)]
    assert toxic.fired == 1
    assert returned == [1, 3, 4]
    assert direct.get(key) == b"4"  # 3 calls, 4 executions
    assert proxy.commands_seen["EVALSHA"] == 4


# ----------------------------------------------------------------------------- reset_all


def _client_id(client: redis.Redis) -> int:
    return int(client.client_id())


@pytest.mark.redis
def test_reset_all_idle_connection_is_replaced_on_next_use(
    proxy: FaultProxy, clients: ClientFactory
) -> None:
    client = no_retry(clients, proxy)
    before = _client_id(client)
    assert proxy.reset_all() == 1
    assert proxy.fired["reset_all"] == 1
    # redis-py's pool checks an idle connection before reuse, sees the RST and reconnects,
    # even with retries off: the command succeeds on a new server-side connection.
    assert _client_id(client) != before


def _blpop_in_thread(client: redis.Redis, key: str) -> tuple[threading.Thread, dict[str, object]]:
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = client.blpop([key], timeout=5)
        except redis.RedisError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.mark.redis
def test_reset_all_fails_an_in_flight_command_without_retry(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    client = no_retry(clients, proxy, socket_timeout=8)
    client.ping()
    thread, outcome = _blpop_in_thread(client, f"{namespace}:q")
    _wait_until(lambda: direct.info("clients")["blocked_clients"] >= 1)
    assert proxy.reset_all() == 1
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), redis.ConnectionError)
    assert proxy.fired["reset_all"] == 1


@pytest.mark.redis
def test_reset_all_in_flight_command_is_reissued_with_default_retry(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    key = f"{namespace}:q"
    client = clients(port=proxy.port, socket_timeout=8)
    client.ping()
    thread, outcome = _blpop_in_thread(client, key)
    _wait_until(lambda: proxy.commands_seen["BLPOP"] == 1)
    _wait_until(lambda: direct.info("clients")["blocked_clients"] >= 1)
    assert proxy.reset_all() == 1
    # Push only once the retried BLPOP is in, so the dead connection cannot take the element.
    _wait_until(lambda: proxy.commands_seen["BLPOP"] == 2)
    direct.rpush(key, "x")
    thread.join(5)
    assert outcome == {"result": (key.encode(), b"x")}


# ------------------------------------------------------------- latency, blackhole, refuse


@pytest.mark.redis
def test_latency_delays_replies(proxy: FaultProxy, clients: ClientFactory) -> None:
    client = no_retry(clients, proxy)
    client.ping()
    proxy.set_latency(0.3)
    started = time.monotonic()
    assert client.ping()
    assert time.monotonic() - started >= 0.3
    assert proxy.fired["latency"] >= 1
    proxy.set_latency(0)
    assert client.ping()


@pytest.mark.redis
def test_blackhole_times_the_client_out_then_recovers(
    proxy: FaultProxy, clients: ClientFactory, direct: redis.Redis, namespace: str
) -> None:
    client = no_retry(clients, proxy, socket_timeout=0.5)
    client.ping()
    proxy.blackhole(True)
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.set(f"{namespace}:k", "v")
    assert time.monotonic() - started >= 0.5
    assert proxy.fired["blackhole"] >= 1
    assert direct.get(f"{namespace}:k") is None  # nothing was forwarded
    proxy.blackhole(False)
    assert client.set(f"{namespace}:k", "v")  # a new connection works
    assert direct.get(f"{namespace}:k") == b"v"


@pytest.mark.redis
def test_refuse_resets_new_connections(proxy: FaultProxy, clients: ClientFactory) -> None:
    proxy.refuse(True)
    client = no_retry(clients, proxy)
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert proxy.fired["refuse"] >= 1
    proxy.refuse(False)
    assert client.ping()


@pytest.mark.redis
def test_close_stops_listening_and_drops_connections(
    redis_proc: RedisProc, clients: ClientFactory
) -> None:
    fault_proxy = FaultProxy("127.0.0.1", redis_proc.port)
    client = no_retry(clients, fault_proxy)
    assert client.ping()
    assert fault_proxy.url == f"redis://127.0.0.1:{fault_proxy.port}/0"
    fault_proxy.close()
    fault_proxy.close()  # idempotent
    assert not fault_proxy._thread.is_alive()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", fault_proxy.port), timeout=1).close()
