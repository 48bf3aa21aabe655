"""The README's examples run as shown, twice in a row, and print what they claim: the quick
start (``tasks.py`` under a real ``chongming-redis worker``, ``producer.py``), the async
example, the pytest-plugin example, the store example and the SQLite example. Only the Redis URL
is replaced by a private server's (the SQLite file's path by a temporary one). Each test runs on
README.md and on its Chinese translation README.zh-CN.md (tests/test_docs_zh.py keeps their code
blocks identical; running both proves the Chinese page's examples, not only their text)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.redis_server import RedisProc

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "README.zh-CN.md")
URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=READMES)
def readme(request: pytest.FixtureRequest) -> str:
    """The text of one README, English or Chinese: every test runs on both."""
    return (ROOT / request.param).read_text("utf-8")


def python_blocks(readme: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme, re.S)


def block(readme: str, first_line: str) -> str:
    """The python block of ``readme`` whose first line is ``first_line`` (``# tasks.py``), or
    whose text contains it."""
    found = [b for b in python_blocks(readme) if b.startswith(first_line) or first_line in b]
    assert len(found) == 1, (first_line, len(found))
    return found[0]


def env_for(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    return {**env, "CHONGMING_REDIS_URL": url, "PYTHONPATH": "."}


def run(code: str, cwd: Path, url: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env_for(url),
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
def app_dir(tmp_path: Path, fresh_redis_proc: RedisProc, readme: str) -> Iterator[tuple[Path, str]]:
    """A directory holding the README's ``tasks.py``, with a real worker process running it
    (the README's own command) on a private Redis."""
    url = fresh_redis_proc.url
    (tmp_path / "tasks.py").write_text(block(readme, "# tasks.py"))
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "chongming_redis.cli", "worker", "tasks:app", "--processes",
             "2"], cwd=tmp_path, env=env_for(url), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            yield tmp_path, url
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def test_the_quick_start_runs_twice_and_prints_what_it_claims(
    app_dir: tuple[Path, str], readme: str
) -> None:
    where, url = app_dir
    producer = block(readme, "# producer.py").replace(URL, url)
    for _ in range(2):
        out = run(producer, where, url).splitlines()
        assert re.fullmatch(r"[0-9a-f]{20} \{'width': 640\}", out[0]), out
        assert out[1] == "['pending', 'running', 'succeeded']"
        assert out[2] == "stopped"
    log = (where / "worker.log").read_text()
    assert "succeeded" in log and "resize" in log  # one line per task


def test_the_sqlite_example_runs_twice_under_the_readmes_worker_command(
    tmp_path: Path, readme: str
) -> None:
    """The worker command as the README shows it (``--store sqlite:///...``, under an exported
    CHONGMING_REDIS_URL that it overrides) and ``producer_sqlite.py``; only the file's path is
    replaced by one in a temporary directory. No Redis is involved."""
    shown = "sqlite:///tmp/thumbnails.sqlite3"
    url = f"sqlite://{tmp_path / 'thumbnails.sqlite3'}"
    command = re.search(r"^chongming-redis worker tasks:app --store \S+ --processes 2$", readme,
                        re.M)  # fmt: skip
    assert command is not None and shown in command.group(0)
    (tmp_path / "tasks.py").write_text(block(readme, "# tasks.py"))
    producer = block(readme, "# producer_sqlite.py").replace(shown, url)
    env = env_for("redis://127.0.0.1:1/0")  # an exported Redis URL nobody listens on
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen(["bash", "-c", "exec " + command.group(0).replace(shown, url)],
                                  cwd=tmp_path, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
        try:
            for _ in range(2):
                assert run(producer, tmp_path, "").splitlines() == ["{'width': 320}"]
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
    log_text = (tmp_path / "worker.log").read_text()
    assert f"SQLite database {tmp_path / 'thumbnails.sqlite3'}" in log_text, log_text


def test_the_pytest_plugin_example_passes(app_dir: tuple[Path, str], readme: str) -> None:
    where, _ = app_dir
    (where / "test_tasks.py").write_text(block(readme, "def test_resize(chongming)"))
    for _ in range(2):
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 "test_tasks.py"], cwd=where, env=env_for(""), capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout


def test_the_store_example_runs_twice_and_ends_stopped_with_a_full_history(
    tmp_path: Path, fresh_redis_proc: RedisProc, readme: str
) -> None:
    url = fresh_redis_proc.url
    code = block(readme, "from chongming_redis import (Command").replace(URL, url)
    for _ in range(2):
        lines = run(code, tmp_path, url).splitlines()
        assert "expected version 1, found version 2" in lines[0]
        assert lines[-2] == "stopped ['pending', 'running', 'stopped']"
        assert lines[-1] == "True"


def test_the_async_example_submits_from_a_coroutine_and_a_worker_runs_it(
    tmp_path: Path, fresh_redis_proc: RedisProc, readme: str
) -> None:
    url = fresh_redis_proc.url
    (tmp_path / "mail.py").write_text(block(readme, "async def endpoint()").replace(URL, url))
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "chongming_redis.cli", "worker",
                                   "mail:app"], cwd=tmp_path, env=env_for(url), stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
        try:
            check = (
                "import asyncio, mail\n"
                "from chongming_redis import Client\n"
                "for _ in range(2):\n"
                "    task_id = asyncio.run(mail.endpoint())\n"
                f"    print(Client.from_url({url!r}, app=mail.app).wait(task_id, timeout=30))\n"
            )
            assert run(check, tmp_path, url).splitlines() == ["sent to ada@example.org"] * 2
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)


def test_the_cli_transcript_is_what_the_cli_prints(app_dir: tuple[Path, str], readme: str) -> None:
    """Each ``$`` line of the README's transcript, run in a shell next to the quick start's
    worker, prints the lines shown under it (the id is the one submitted; latencies vary)."""
    where, url = app_dir
    transcript = re.search(r"```text\n(\$ chongming-redis submit.*?)```", readme, re.S)
    assert transcript is not None
    steps: list[tuple[str, list[str]]] = []
    for line in transcript.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    shown_id = steps[0][1][0]
    real_id = ""
    for command, expected in steps:
        env = env_for(url)  # the console script of this interpreter's environment
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        result = subprocess.run(["bash", "-c", command.replace(shown_id, real_id or shown_id)],
                                cwd=where, env=env, capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        out = result.stdout.splitlines()
        if not real_id:
            real_id = out[0]
        wanted = [e.replace(shown_id, real_id) for e in expected]
        got = [re.sub(r"after \d+ ms", "after N ms", o) for o in out]
        assert got == [re.sub(r"after \d+ ms", "after N ms", w) for w in wanted], command


def test_the_contract_examples_bind_as_the_readme_shows(readme: str) -> None:
    """'Prove your own backend': each class binds its contract (run here on the in-memory
    store, with the extensions it really has); before, the README said the extension and feed
    contracts bind like StoreContract, from a module they are not in."""
    from chongming_redis.stores.memory import InMemoryTaskStore
    from chongming_redis.testing.extensions_contract import ExtensionsContract
    from chongming_redis.testing.feed_contract import FeedContract
    from chongming_redis.testing.store_contract import StoreContract

    names: dict[str, Any] = {"MyStore": lambda *_: InMemoryTaskStore()}
    exec(block(readme, "class TestMyStore(StoreContract)"), names)
    exec(block(readme, "class TestMyStoreExtensions(ExtensionsContract)"), names)
    assert issubclass(names["TestMyStore"], StoreContract)
    assert issubclass(names["TestMyStoreExtensions"], ExtensionsContract)
    assert names["TestMyStoreExtensions"].expected_extensions == {"BatchingStore",
                                                                  "ServerClockStore"}  # fmt: skip
    feed = names["TestMyStoreFeed"]()
    assert isinstance(feed, FeedContract)
    feed.setup_method(None)
    try:
        feed.test_a_first_read_over_several_pages_returns_every_task_once_in_order()
    finally:
        feed.teardown_method(None)
