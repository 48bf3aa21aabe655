"""The stores' Redis connections survive a signal handler that raises mid-command.

hiredis's ``pack_command`` turns numbers into text with ``PyObject_Repr``, which runs pending
signal handlers; one that raises made it read a NULL and the process died of SIGSEGV (CI saw
``chongming-redis changes --follow`` die so at SIGINT). ``_redis.packer`` hands hiredis bytes
only. Each run is a child process: a crash must fail the test, not end the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from redis.connection import HiredisRespSerializer
from redis.exceptions import DataError

from chongming_redis.embedded.redis_cluster import RedisClusterProcs
from chongming_redis.stores._redis.packer import PACKER
from tests.support.redis_server import RedisProc

# A store client's connection packs an int-heavy command 2,000 times while SIGALRM fires
# every millisecond with a handler that raises; then the store still answers.
CHILD = textwrap.dedent("""
    import signal, sys
    from chongming_redis.stores.redis import RedisTaskStore

    url, cluster = sys.argv[1], sys.argv[2] == "cluster"
    store = RedisTaskStore.from_url(url, namespace="packer-test", cluster=cluster)
    client = store._client
    pool = (client.get_default_node().redis_connection.connection_pool if cluster
            else client.connection_pool)
    connection = pool.make_connection()

    class Raised(Exception):
        pass

    inside = False  # the handler raises only inside the call under test, once per call

    def handler(signum, frame):
        global inside
        if inside:
            inside = False
            raise Raised

    signal.signal(signal.SIGALRM, handler)
    command = (b"EVALSHA", b"0" * 40, 2) + tuple(range(-1000, 1000)) + (0.5, "text")
    caught = 0
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    for _ in range(2000):
        try:
            inside = True
            connection.pack_command(*command)
            inside = False
        except Raised:
            caught += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    print(caught, store.get("absent"))
""")


def run_child(url: str, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD, url, mode],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_raising_signal_handler_interrupts_a_command_cleanly(redis_proc: RedisProc) -> None:
    result = run_child(redis_proc.url, "single")
    assert result.returncode == 0, result.stderr[-3000:]
    caught, answer = result.stdout.split()
    assert int(caught) > 0  # the handler did fire mid-loop: the run tested something
    assert answer == "None"


def test_a_cluster_store_survives_it_too(redis_cluster: RedisClusterProcs) -> None:
    result = run_child(redis_cluster.url, "cluster")
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[0]) > 0


@pytest.mark.parametrize(
    "args",
    [
        (b"SET", b"k", b"v"),
        ("EVALSHA", "abc", 3, -7, 0, 2**70, 1.5, -0.25, 1e300, "tÿpe", b"\x00\xff"),
        (b"HSET", memoryview(b"key"), bytearray(b"field"), 12),
    ],
)
def test_it_packs_exactly_as_hiredis_does(args: tuple[object, ...]) -> None:
    assert PACKER.pack(*args) == HiredisRespSerializer().pack(*args)


def test_it_refuses_what_hiredis_refuses() -> None:
    for bad in (True, None, object()):
        with pytest.raises(DataError):
            PACKER.pack(b"SET", b"k", bad)
        with pytest.raises(DataError):
            HiredisRespSerializer().pack(b"SET", b"k", bad)
