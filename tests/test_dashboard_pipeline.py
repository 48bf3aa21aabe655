"""The dashboard's workflows (issue 28), on the in-memory store and on a real Redis: the
pipeline page draws its tasks as an inline SVG (a node per task, coloured and labelled by
status, linked to its page; an edge per parent within the pipeline) and follows the store
live; its JSON twin under ``/api/v1/pipelines/``; an unknown pipeline is a 404; a task page
lists its parents with their statuses, its ``on_parent_failure`` and links its pipeline;
WAITING is counted wherever statuses are (the overview, ``/metrics``). Also the pure layout
of ``dashboard/pipeline.py`` on a diamond and on nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timezone
from html import unescape
from typing import Any
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from chongming_redis.client.client import Client
from chongming_redis.dashboard import create_app
from chongming_redis.dashboard.pipeline import (
    MARGIN,
    NODE_H,
    NODE_W,
    depths,
    graph_json,
    layout,
    pipeline_path,
)
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.protocol import TaskStore
from tests.support.dashboard import served, snapshot
from tests.test_dashboard_live import advance, patches_until

pytestmark = pytest.mark.timeout(120)
NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)


@pytest.fixture
def store(memory_or_redis_store: TaskStore) -> TaskStore:
    return memory_or_redis_store


@pytest.fixture
def web(store: TaskStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, namespace="flows")) as client:
        yield client


def diamond(store: TaskStore, pipeline: str = "wf-diamond") -> dict[str, str]:
    """top -> left, right -> join ("run"), submitted as one workflow; their ids by role."""
    client = Client(store, name="tests")
    wf = client.workflow(pipeline_run_id=pipeline)
    top = wf.add("fetch", {"n": 1})
    left = wf.add("fetch", {"n": 2}, after=[top])
    right = wf.add("fetch", {"n": 3}, after=[top])
    wf.add("merge", None, after=[left, right], on_parent_failure="run")
    handles = wf.submit()
    ids = dict(zip(("top", "left", "right", "join"), (h.task_id for h in handles), strict=True))
    joined = store.get(ids["join"])
    assert joined is not None and joined.parents == (ids["left"], ids["right"])
    return ids


def nodes(html: str) -> dict[str, str]:
    """The SVG's nodes: task id -> status (from each node's link)."""
    found = re.findall(r'<a class="node n-([a-z]+)" href="[^"]+" data-task="([^"]*)"', html)
    return {unescape(task_id): status for status, task_id in found}


def edges(html: str) -> set[tuple[str, str]]:
    found = re.findall(r'<path class="edge" data-from="([^"]*)" data-to="([^"]*)"', html)
    return {(unescape(a), unescape(b)) for a, b in found}


# -- the pure layout -----------------------------------------------------------------------------


def node_task(task_id: str, i: int, *parents: str, **fields: Any) -> TaskSnapshot:
    status = TaskStatus.WAITING if parents else TaskStatus.PENDING
    return snapshot(task_id, i, status=status, parents=parents, pipeline_run_id="p", **fields)


def test_the_layout_of_a_diamond_puts_each_task_right_of_its_parents() -> None:
    tasks = [node_task("a", 0), node_task("b", 1, "a"), node_task("c", 2, "a"),
             node_task("d", 3, "b", "c", "outside")]  # fmt: skip
    assert depths(tasks) == {"a": 0, "b": 1, "c": 1, "d": 2}
    graph = layout("p", tasks, NOW, truncated=False)
    by_id = {n.task.task_id: n for n in graph.nodes}
    assert [n.task.task_id for n in graph.nodes] == ["a", "b", "c", "d"]  # creation order
    assert {k: (n.depth, n.row) for k, n in by_id.items()} == {
        "a": (0, 0),
        "b": (1, 0),
        "c": (1, 1),
        "d": (2, 0),
    }
    # Only the parents within the pipeline are drawn: "outside" is no node and no edge.
    assert by_id["d"].parents == ("b", "c")
    pairs = {(e.parent.task.task_id, e.child.task.task_id) for e in graph.edges}
    assert pairs == {("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")}
    for edge in graph.edges:
        x1, y1, x2, y2 = edge.points
        assert x1 == edge.parent.x + NODE_W and x2 == edge.child.x and x1 < x2
        assert y1 == edge.parent.y + NODE_H // 2 and y2 == edge.child.y + NODE_H // 2
    # Every box fits in the drawing; two boxes never overlap.
    for node in graph.nodes:
        assert node.x >= MARGIN and node.x + NODE_W <= graph.width - MARGIN
        assert node.y >= MARGIN and node.y + NODE_H <= graph.height - MARGIN
    boxes = {(n.x, n.y) for n in graph.nodes}
    assert len(boxes) == 4
    assert graph.counts[TaskStatus.WAITING] == 3 and graph.counts[TaskStatus.PENDING] == 1
    doc = graph_json(graph)
    assert [n["task_id"] for n in doc["nodes"]] == ["a", "b", "c", "d"]  # type: ignore[index]
    assert doc["nodes"][3]["parents"] == ["b", "c", "outside"]  # type: ignore[index]
    assert len(doc["edges"]) == 4  # type: ignore[arg-type]


def test_a_column_is_ordered_by_its_parents_rows_and_the_order_given_does_not_matter() -> None:
    # x's child comes first in creation order but x sits below w: its child goes below too.
    tasks = [node_task("w", 0), node_task("x", 1), node_task("cx", 2, "x"),
             node_task("cw", 3, "w")]  # fmt: skip
    graph = layout("p", tasks, NOW, truncated=False)
    rows = {n.task.task_id: (n.depth, n.row) for n in graph.nodes}
    assert rows == {"w": (0, 0), "x": (0, 1), "cw": (1, 0), "cx": (1, 1)}
    # A child listed before its parent (a query's order) gets the same depths.
    assert depths(list(reversed(tasks))) == depths(tasks) == {"w": 0, "x": 0, "cx": 1, "cw": 1}


def test_the_layout_of_nothing_is_an_empty_drawing() -> None:
    graph = layout("p", [], NOW, truncated=False)
    assert graph.nodes == () and graph.edges == ()
    assert (graph.width, graph.height) == (2 * MARGIN, 2 * MARGIN)
    assert set(graph.counts.values()) == {0} and set(graph.counts) == set(TaskStatus)
    assert depths([]) == {}
    assert graph_json(graph)["nodes"] == []


def test_pipeline_paths_are_percent_encoded_and_dots_go_in_the_query() -> None:
    assert pipeline_path("wf-1") == "/pipelines/wf-1"
    assert pipeline_path("a/b c") == "/pipelines/a%2Fb%20c"
    assert pipeline_path("..") == "/pipeline?id=.."


# -- the pages -----------------------------------------------------------------------------------


def test_the_pipeline_page_draws_every_task_coloured_by_status_with_its_edges(
    web: TestClient, store: TaskStore
) -> None:
    ids = diamond(store)
    page = web.get("/pipelines/wf-diamond")
    assert page.status_code == 200
    html = page.text
    assert nodes(html) == {ids["top"]: "pending", ids["left"]: "waiting",
                           ids["right"]: "waiting", ids["join"]: "waiting"}  # fmt: skip
    assert edges(html) == {(ids["top"], ids["left"]), (ids["top"], ids["right"]),
                           (ids["left"], ids["join"]), (ids["right"], ids["join"])}  # fmt: skip
    for task_id in ids.values():
        assert f'href="/tasks/{quote(task_id, safe="")}" data-task="{task_id}"' in html
    assert '<svg class="pipeline"' in html and 'role="img"' in html
    assert '<b data-pipeline-status="waiting">3</b>' in html
    assert '<b data-pipeline-status="pending">1</b>' in html
    assert 'data-events="/events/pipeline?id=wf-diamond"' in html
    assert 'href="/tasks?pipeline=wf-diamond"' in html
    # The list of the pipeline's tasks shows WAITING as a status of its own.
    listed = web.get("/tasks", params={"pipeline": "wf-diamond", "status": "waiting"}).text
    assert listed.count('<td class="st st-waiting" data-status="waiting">waiting</td>') == 3


def test_an_unknown_pipeline_is_a_404_page_and_a_404_in_the_api(
    web: TestClient, store: TaskStore
) -> None:
    diamond(store)
    page = web.get("/pipelines/wf-nothing")
    assert page.status_code == 404 and "No such pipeline" in page.text
    assert "wf-nothing" in page.text
    api = web.get("/api/v1/pipelines/wf-nothing")
    assert api.status_code == 404
    assert api.json() == {"error": "no_such_pipeline",
                          "message": "no task carries pipeline id 'wf-nothing'"}  # fmt: skip
    assert web.get("/pipeline", params={"id": ""}).status_code == 400
    assert web.get("/events/pipeline").status_code == 400


def test_an_awkward_pipeline_id_has_its_page(web: TestClient, store: TaskStore) -> None:
    for pipeline in ("a/b <x>", ".."):
        ids = diamond(store, pipeline)
        path = pipeline_path(pipeline)
        html = web.get(path).text
        assert set(nodes(html)) == set(ids.values()), path
        assert "&lt;x&gt;" in html or pipeline == ".."
        link = f'href="{pipeline_path(pipeline).replace("&", "&amp;")}" id="pipeline-link"'
        assert link in web.get(f"/tasks/{ids['join']}").text


def test_the_pipeline_api_has_the_nodes_and_edges_as_the_page_draws_them(
    web: TestClient, store: TaskStore
) -> None:
    ids = diamond(store)
    doc = web.get("/api/v1/pipelines/wf-diamond").json()
    assert doc["namespace"] == "flows" and doc["pipeline_run_id"] == "wf-diamond"
    assert doc["truncated"] is False and doc["read_at"].endswith("Z")
    assert doc["counts"] == {s.value: 0 for s in TaskStatus} | {"waiting": 3, "pending": 1}
    by_id = {n["task_id"]: n for n in doc["nodes"]}
    assert list(by_id) == [ids["top"], ids["left"], ids["right"], ids["join"]]
    join = by_id[ids["join"]]
    assert join["parents"] == [ids["left"], ids["right"]] and join["on_parent_failure"] == "run"
    assert (join["depth"], join["status"], join["name"]) == (2, "waiting", "merge")
    assert {(e["from"], e["to"]) for e in doc["edges"]} == edges(
        web.get("/pipelines/wf-diamond").text
    )
    task = web.get(f"/api/v1/tasks/{ids['join']}").json()
    assert task["parents"] == [ids["left"], ids["right"]] and task["on_parent_failure"] == "run"


def test_a_task_page_lists_its_parents_with_their_statuses_and_links_its_pipeline(
    web: TestClient, store: TaskStore
) -> None:
    ids = diamond(store)
    advance(store, ids["top"], status=TaskStatus.SUCCEEDED)  # left and right are released
    html = web.get(f"/tasks/{ids['join']}").text
    parents = re.search(r'<dd id="task-parents">(.*?)</dd>', html)
    assert parents is not None
    shown = re.findall(r'<a href="/tasks/([^"]+)" class="parent" data-task="[^"]*">[^<]*</a> '
                       r'<span class="st st-([a-z]+)"', parents.group(1))  # fmt: skip
    assert shown == [(ids["left"], "pending"), (ids["right"], "pending")]
    assert 'id="task-on-parent-failure" data-policy="run"' in html
    assert 'data-status="waiting"' in html and "st-waiting" in html
    assert 'href="/pipelines/wf-diamond" id="pipeline-link"' in html
    top = web.get(f"/tasks/{ids['top']}").text
    assert 'id="task-parents"' not in top and "on parent failure" not in top


def test_the_overview_and_metrics_count_waiting_tasks(web: TestClient, store: TaskStore) -> None:
    diamond(store)
    assert '<b data-status="waiting">3</b>' in web.get("/").text
    assert web.get("/api/v1/overview").json()["counts"]["waiting"] == 3
    metrics = web.get("/metrics").text
    assert re.search(r'chongming_tasks\{namespace="flows",status="waiting"\} 3\.0', metrics)


def test_the_pipeline_page_follows_the_store_live(store: TaskStore) -> None:
    ids = diamond(store)
    with served(create_app(store, namespace="live", feed_interval=0.05)) as base:
        patches = patches_until(
            f"{base}/events/pipeline?id=wf-diamond",
            lambda p: nodes(p.get("pipeline-graph", "")).get(ids["left"]) == "pending",
            act=lambda: advance(store, ids["top"], status=TaskStatus.SUCCEEDED),
        )
    first = nodes(patches[0]["pipeline-graph"])
    assert first[ids["top"]] == "pending" and first[ids["left"]] == "waiting"
    last = nodes(patches[-1]["pipeline-graph"])
    assert last[ids["top"]] == "succeeded" and last[ids["right"]] == "pending"
