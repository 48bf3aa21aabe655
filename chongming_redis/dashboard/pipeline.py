"""A pipeline's graph (``/pipelines/<id>``): the tasks that share one ``pipeline_run_id``
(``client.workflow()``, ``submit --pipeline``) and the edges between them, laid out in layers
for an inline SVG the server renders (no script draws it).

One bounded read: the pipeline's first ``MAX_NODES`` tasks, oldest first (a parent is always
created before its child, so the graph shown is closed under "parents within the pipeline"
but for the ones cut off). A task's depth is 1 + the greatest depth of its parents within the
pipeline (0 for a task with none there: parents outside the pipeline are not drawn). Depths
are the columns, left to right; within a column the tasks are ordered by the mean row of
their parents (fewer crossings), then by creation. Pure but for ``read_pipeline``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote, urlencode

from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.validation import check_identifier

#: At most this many tasks are drawn (the page says when the pipeline has more).
MAX_NODES = 500
#: A node's box and the gaps between columns and rows, in SVG user units (px).
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 176, 44, 56, 14, 10
#: A node shows the first characters of its task id (the whole id on hover and in the link).
SHORT_ID = 10


@dataclass(frozen=True)
class Node:
    task: TaskSnapshot
    depth: int
    row: int  # its place in its column, from the top
    #: Its parents drawn on this graph (in the pipeline and read), in the order stored.
    parents: tuple[str, ...]

    @property
    def x(self) -> int:
        return MARGIN + self.depth * (NODE_W + GAP_X)

    @property
    def y(self) -> int:
        return MARGIN + self.row * (NODE_H + GAP_Y)

    @property
    def width(self) -> int:
        return NODE_W

    @property
    def height(self) -> int:
        return NODE_H

    @property
    def short_id(self) -> str:
        task_id = self.task.task_id
        return task_id if len(task_id) <= SHORT_ID + 1 else task_id[:SHORT_ID] + "…"


@dataclass(frozen=True)
class Edge:
    parent: Node
    child: Node

    @property
    def points(self) -> tuple[int, int, int, int]:
        """``x1, y1, x2, y2``: the parent's right edge to the child's left edge, mid-height."""
        p, c = self.parent, self.child
        return p.x + NODE_W, p.y + NODE_H // 2, c.x, c.y + NODE_H // 2


@dataclass(frozen=True)
class PipelineGraph:
    pipeline_run_id: str
    now: datetime
    nodes: tuple[Node, ...]  # in creation order
    edges: tuple[Edge, ...]
    #: The pipeline has more tasks than ``MAX_NODES``: only its oldest are drawn.
    truncated: bool = False

    @property
    def width(self) -> int:
        columns = max((n.depth for n in self.nodes), default=-1) + 1
        return 2 * MARGIN + max(columns * (NODE_W + GAP_X) - GAP_X, 0)

    @property
    def height(self) -> int:
        rows = max((n.row for n in self.nodes), default=-1) + 1
        return 2 * MARGIN + max(rows * (NODE_H + GAP_Y) - GAP_Y, 0)

    @property
    def counts(self) -> dict[TaskStatus, int]:
        """The drawn tasks per status, every status present."""
        counts = dict.fromkeys(TaskStatus, 0)
        for node in self.nodes:
            counts[node.task.status] += 1
        return counts


def pipeline_path(pipeline_run_id: str) -> str:
    """A pipeline page's path: any id, percent-encoded; ``.`` and ``..`` (which a browser
    would resolve as path segments) in the query string instead (``/pipeline?id=``)."""
    if pipeline_run_id in (".", ".."):
        return "/pipeline?" + urlencode({"id": pipeline_run_id})
    return "/pipelines/" + quote(pipeline_run_id, safe="")


def read_pipeline(store: TaskStore, pipeline_run_id: str, limit: int = MAX_NODES) -> PipelineGraph:
    """The pipeline's graph from one query (``limit`` + 1 tasks: one more tells there are
    more); ``TypeError``/``ValueError`` for an id no task could carry."""
    check_identifier(pipeline_run_id, "pipeline_run_id")
    found = store.query(TaskQuery(pipeline_run_id=pipeline_run_id, limit=limit + 1))
    now = datetime.now(timezone.utc)
    return layout(pipeline_run_id, found[:limit], now, truncated=len(found) > limit)


def depths(tasks: Sequence[TaskSnapshot]) -> dict[str, int]:
    """Each task's depth within ``tasks`` (parents outside them ignored). A cycle cannot be
    stored (a parent exists before its child); were one read, its back edge counts 0."""
    by_id = {t.task_id: t for t in tasks}
    depth: dict[str, int] = {}
    for task in tasks:
        stack: list[tuple[str, bool]] = [(task.task_id, False)]
        open_: set[str] = set()
        while stack:
            task_id, expanded = stack.pop()
            if task_id in depth or (task_id in open_ and not expanded):
                continue
            inside = [p for p in by_id[task_id].parents if p in by_id and p not in open_]
            if expanded:
                open_.discard(task_id)
                depth[task_id] = 1 + max((depth.get(p, 0) for p in inside), default=-1)
                continue
            open_.add(task_id)
            stack.append((task_id, True))
            stack.extend((p, False) for p in inside if p not in depth)
    return depth


def layout(
    pipeline_run_id: str, tasks: Sequence[TaskSnapshot], now: datetime, *, truncated: bool
) -> PipelineGraph:
    """The nodes in columns by depth, ordered in each column by their parents' mean row."""
    depth = depths(tasks)
    order = {t.task_id: i for i, t in enumerate(tasks)}
    columns: dict[int, list[TaskSnapshot]] = {}
    for task in tasks:
        columns.setdefault(depth[task.task_id], []).append(task)
    row: dict[str, int] = {}
    for d in sorted(columns):

        def key(task: TaskSnapshot) -> tuple[float, int]:
            placed = [row[p] for p in task.parents if p in row]
            return (sum(placed) / len(placed) if placed else -1.0, order[task.task_id])

        for i, task in enumerate(sorted(columns[d], key=key)):
            row[task.task_id] = i
    nodes = {
        t.task_id: Node(t, depth[t.task_id], row[t.task_id],
                        tuple(p for p in t.parents if p in order))
        for t in tasks
    }  # fmt: skip
    edges = tuple(Edge(nodes[p], node) for node in nodes.values() for p in node.parents)
    return PipelineGraph(pipeline_run_id, now, tuple(nodes.values()), edges, truncated)


def _time(moment: datetime) -> str:
    """The feed's time format: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def graph_json(graph: PipelineGraph) -> dict[str, object]:
    """``/api/v1/pipelines/<id>``: the nodes (creation order) with their depth and row in the
    drawing and all their parents (``edges``: the ones within the drawn graph)."""
    return {
        "pipeline_run_id": graph.pipeline_run_id,
        "read_at": _time(graph.now),
        "truncated": graph.truncated,
        "max_nodes": MAX_NODES,
        "counts": {status.value: n for status, n in graph.counts.items()},
        "nodes": [node_json(n) for n in graph.nodes],
        "edges": [{"from": e.parent.task.task_id, "to": e.child.task.task_id}
                  for e in graph.edges],
    }  # fmt: skip


def node_json(node: Node) -> dict[str, object]:
    task = node.task
    return {
        "task_id": task.task_id,
        "name": task.name,
        "status": task.status.value,
        "status_version": task.status_version,
        "created_at": _time(task.created_at),
        "updated_at": _time(task.updated_at),
        "depth": node.depth,
        "row": node.row,
        "parents": list(task.parents),
        "on_parent_failure": task.on_parent_failure,
    }
