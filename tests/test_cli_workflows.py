"""The CLI's workflows (issue 28), run as real processes against the session's redis-server:
``submit --after ID (repeatable) --on-parent-failure stop|run --pipeline ID`` creates a task
``WAITING`` that the store releases when its parents end; a missing parent is one ``error:``
line with nothing written; ``tasks --status waiting`` and ``--pipeline`` find it; ``show``
lists the parents with their statuses (``--json`` carries them); ``stats`` counts WAITING."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from chongming_redis.model import TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.test_cli import APP, cli, ok, user_error

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


@pytest.fixture
def store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    s = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield s
    s.close()


@pytest.fixture
def common(redis_proc: RedisProc, namespace: str) -> tuple[str, str]:
    return (f"--redis={redis_proc.url}", f"--namespace={namespace}")


def submit(common: tuple[str, str], *args: str) -> list[str]:
    return ok(cli("submit", APP, "work", *args, *common)).split()


def succeed(store: RedisTaskStore, task_id: str) -> None:
    """The parent ends as a worker would end it: one store write to ``SUCCEEDED``."""
    task = store.get(task_id)
    assert task is not None
    ended = task.evolve(status=TaskStatus.SUCCEEDED, status_version=task.status_version + 1,
                        updated_at=datetime.now(timezone.utc))  # fmt: skip
    store.save(ended, expect_version=task.status_version)


def test_submit_after_creates_a_waiting_child_the_store_releases_when_its_parents_succeed(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    (first,) = submit(common)
    (second,) = submit(common)
    (child,) = submit(common, "--after", first, "--after", second, "--pipeline", "wf-cli")
    task = store.get(child)
    assert task is not None and task.status is TaskStatus.WAITING
    assert task.parents == (first, second) and task.on_parent_failure == "stop"
    assert task.pipeline_run_id == "wf-cli"
    succeed(store, first)
    after_one = store.get(child)
    assert after_one is not None and after_one.status is TaskStatus.WAITING
    succeed(store, second)
    released = store.get(child)
    assert released is not None and released.status is TaskStatus.PENDING
    moves = [(h.from_status, h.to_status) for h in store.history(child)]
    assert moves == [(None, TaskStatus.WAITING), (TaskStatus.WAITING, TaskStatus.PENDING)]


def test_on_parent_failure_run_and_count_give_every_child_the_parents(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    (parent,) = submit(common)
    children = submit(common, "--after", parent, "--on-parent-failure", "run", "--count", "3")
    assert len(children) == 3
    for child in children:
        task = store.get(child)
        assert task is not None and task.status is TaskStatus.WAITING
        assert task.parents == (parent,) and task.on_parent_failure == "run"


def test_a_missing_parent_is_one_error_line_and_nothing_is_written(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    (parent,) = submit(common)
    before = store.counts()
    result = cli("submit", APP, "work", "--after", parent, "--after", "never-made", *common)
    user_error(result, "--after never-made", "no such task", "nothing submitted")
    assert result.stdout == ""
    many = cli("submit", APP, "work", "--after", "never-made", "--count", "5", *common)
    user_error(many, "never-made")
    assert store.counts() == before


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--on-parent-failure", "run"), ("--on-parent-failure", "--after")),
        (("--on-parent-failure", "stop"), ("--on-parent-failure", "--after")),
        (("--after", "p", "--on-parent-failure", "maybe"), ("stop or run", "'maybe'")),
        (("--after", "p", "--after", "p"), ("'p' more than once",)),
        (("--after", ""), ("--after", "empty")),
        (("--pipeline", ""), ("--pipeline", "empty")),
    ],
    ids=["policy-without-after", "stop-without-after", "bad-policy", "repeated", "empty-id",
         "empty-pipeline"],
)  # fmt: skip
def test_bad_workflow_options_are_one_clear_line(
    store: RedisTaskStore, common: tuple[str, str], args: tuple[str, ...], fragments: tuple[str]
) -> None:
    user_error(cli("submit", APP, "work", *args, *common), *fragments)
    assert sum(store.counts().values()) == 0


def test_tasks_finds_the_waiting_and_the_pipeline_and_stats_counts_waiting(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    (parent,) = submit(common, "--pipeline", "wf-list")
    (child,) = submit(common, "--after", parent, "--pipeline", "wf-list")
    (other,) = submit(common)
    waiting = json.loads(ok(cli("tasks", "--status", "waiting", "--json", *common)))
    assert [t["task_id"] for t in waiting["tasks"]] == [child]
    assert waiting["tasks"][0]["status"] == "waiting"
    listed = json.loads(ok(cli("tasks", "--pipeline", "wf-list", "--json", *common)))
    assert [t["task_id"] for t in listed["tasks"]] == [parent, child]
    table = ok(cli("tasks", "--status", "waiting", *common, wide=True))
    assert child in table and "waiting" in table and other not in table
    stats = json.loads(ok(cli("stats", "--json", *common)))
    assert stats["counts"]["waiting"] == 1 and stats["counts"]["pending"] == 2
    assert stats["total"] == 3
    text = ok(cli("stats", *common, wide=True))
    rows = [line.replace("│", " ").split() for line in text.splitlines()]
    assert ["waiting", "1"] in [row[:2] for row in rows], text
    header = next(
        row
        for row in (line.replace("┃", " ").split() for line in text.splitlines())
        if row[:1] == ["bkt"]
    )
    assert header[1:3] == ["waiting", "pending"], text


def test_show_lists_the_parents_with_their_statuses_and_the_policy(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    (done,) = submit(common)
    (open_,) = submit(common)
    succeed(store, done)
    (child,) = submit(common, "--after", done, "--after", open_, "--on-parent-failure", "run")
    text = ok(cli("show", child, *common, wide=True))
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert f"{done} succeeded, {open_} pending" in rows["after"], text
    assert "run" in text.split("on parent failure", 1)[1].splitlines()[0]
    doc = json.loads(ok(cli("show", child, "--json", *common)))
    task = doc["task"]
    assert task["status"] == "waiting" and task["parents"] == [done, open_]
    assert task["on_parent_failure"] == "run"
    assert task["parent_statuses"] == {done: "succeeded", open_: "pending"}
    # A parent with no parents of its own: none shown.
    plain = json.loads(ok(cli("show", open_, "--json", *common)))["task"]
    assert plain["parents"] == [] and plain["parent_statuses"] == {}
    assert "after" not in {line.split()[0] for line in ok(cli("show", open_, *common)).splitlines()
                           if line.strip()}  # fmt: skip
