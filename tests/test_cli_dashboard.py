"""``chongming-redis dashboard`` as a user runs it: it says where it listens, serves the pages
and metrics, prints the sign-in link only with ``--allow-control``, stops on Ctrl-C; every
mistake (no Redis, a port in use, a bad port, a token without control) is one line, exit 1."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from chongming_redis.runtime.controller import Controller
from tests.support.redis_server import RedisProc
from tests.support.store_targets import WITH_CLUSTER, StoreTarget
from tests.test_cli_control import one_error_line

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[1]
TOKEN = "a-token-of-twenty-chars"


def environment(url: str | None, namespace: str) -> dict[str, str]:
    """The store in the environment: ``CHONGMING_REDIS_URL`` for Redis, else
    ``CHONGMING_STORE_URL``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    if url is not None:
        redis = url.startswith(("redis", "unix"))
        env["CHONGMING_REDIS_URL" if redis else "CHONGMING_STORE_URL"] = url
    env["CHONGMING_NAMESPACE"] = namespace
    return env


def cli(*args: str, url: str | None, namespace: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chongming_redis.cli", "dashboard", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=environment(url, namespace))  # fmt: skip


@contextmanager
def dashboard(
    *args: str, url: str, namespace: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, list[str]]]:
    """The running dashboard: its base URL and the lines it printed at start."""
    with subprocess.Popen([sys.executable, "-m", "chongming_redis.cli", "dashboard",
                           "--port", "0", *args], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env={**environment(url, namespace), **(env or {})}) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stderr is not None
            lines = [proc.stdout.readline().strip(), proc.stdout.readline().strip()]
            found = re.search(r"(http://127\.0\.0\.1:\d+)/$", lines[0])
            assert found is not None, lines
            # Served once: the SIGINT below must not land while uvicorn builds its event loop.
            httpx.get(found.group(1) + "/", timeout=15)
            yield found.group(1), lines
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=15)
            assert proc.returncode == 0, err
            assert "Traceback" not in err and out.strip().endswith("dashboard stopped")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.mark.parametrize("target", WITH_CLUSTER, indirect=True)
def test_it_serves_the_pages_read_only_by_default(target: StoreTarget) -> None:
    """On every store, given in the environment (``CHONGMING_STORE_URL`` for SQLite and
    PostgreSQL; ``--cluster`` on Redis Cluster): it says which store it shows, and serves its
    tasks."""
    from chongming_redis.stores.urls import parse_store_url
    from tests.support.pool_app import app

    store = target.open()
    task_id = Controller(store, app=app).submit("work", {"ms": 1})
    store.close()
    where = parse_store_url(target.url).where(target.namespace)
    with dashboard(*target.flags, url=target.url, namespace=target.namespace) as (base, lines):
        assert lines[0].startswith(f"dashboard of {where}: "), lines[0]
        assert lines[1].startswith("read-only")
        assert httpx.get(base + "/").status_code == 200
        assert task_id in httpx.get(base + "/tasks").text
        assert "chongming_tasks{" in httpx.get(base + "/metrics").text
        assert httpx.get(base + "/login").status_code == 404


def test_allow_control_prints_the_sign_in_link_that_works(
    redis_proc: RedisProc, namespace: str
) -> None:
    with dashboard("--allow-control", url=redis_proc.url, namespace=namespace) as (base, lines):
        found = re.search(r"sign in at (\S+)$", lines[1])
        assert found is not None and found.group(1).startswith(base + "/login?token=")
        signed = httpx.get(found.group(1), follow_redirects=False)
        assert signed.status_code == 303 and "chongming_session" in signed.headers["set-cookie"]
        token = found.group(1).split("token=", 1)[1]
        assert len(token) >= 16
    with dashboard("--allow-control", "--token", TOKEN, url=redis_proc.url,
                   namespace=namespace) as (base, lines):  # fmt: skip
        assert lines[1].endswith(f"login?token={TOKEN}")


def test_a_port_in_use_is_one_line(redis_proc: RedisProc, namespace: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = cli("--port", str(port), url=redis_proc.url, namespace=namespace)
    one_error_line(result, 1, f"cannot listen on 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--port", "70000"), "--port must be from 0 to 65535"),
        (("--port", "x"), "port"),
        (("--token", TOKEN), "--token is for --allow-control"),
        (("--allow-control", "--token", "short"), "at least 16 characters"),
    ],
)
def test_bad_options_are_one_line(
    redis_proc: RedisProc, namespace: str, args: tuple[str, ...], says: str
) -> None:
    one_error_line(cli(*args, url=redis_proc.url, namespace=namespace), 1, says)


def test_no_redis_or_an_unreachable_one_is_one_line(namespace: str) -> None:
    one_error_line(cli(url=None, namespace=namespace), 1, "no Redis given")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    started = time.monotonic()
    result = cli(url=f"redis://127.0.0.1:{port}/0", namespace=namespace)
    one_error_line(result, 1)
    assert time.monotonic() - started < 30


def test_a_foreign_host_name_is_refused_and_allowed_hosts_extend_it(
    redis_proc: RedisProc, namespace: str
) -> None:
    """A web page that rebinds its own DNS name to 127.0.0.1 sends its own Host: refused."""
    with dashboard(url=redis_proc.url, namespace=namespace) as (base, _):
        assert httpx.get(base + "/api/v1/overview").status_code == 200
        port = base.rsplit(":", 1)[1]
        assert httpx.get(base + "/", headers={"host": f"localhost:{port}"}).status_code == 200
        rebound = httpx.get(base + "/api/v1/overview", headers={"host": "attacker.example"})
        assert rebound.status_code == 400
    with dashboard("--allowed-host", "dash.example", url=redis_proc.url,
                   namespace=namespace) as (base, _):  # fmt: skip
        assert httpx.get(base + "/", headers={"host": "dash.example"}).status_code == 200
        assert httpx.get(base + "/", headers={"host": "other.example"}).status_code == 400


def test_an_exported_token_does_not_turn_control_on(redis_proc: RedisProc, namespace: str) -> None:
    exported = {"CHONGMING_DASHBOARD_TOKEN": TOKEN}
    with dashboard(url=redis_proc.url, namespace=namespace, env=exported) as (base, lines):
        assert lines[1].startswith("read-only")
        assert httpx.get(base + "/login").status_code == 404
    with dashboard("--allow-control", url=redis_proc.url, namespace=namespace,
                   env=exported) as (base, lines):  # fmt: skip
        assert lines[1].endswith(f"login?token={TOKEN}")
