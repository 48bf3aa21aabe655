"""``Workflow``: a graph of tasks submitted together (``client.workflow()``), with the sugar
Celery users look for: ``chain`` (each step after the one before), ``group`` (side by side)
and a join (a chord's body: ``wf.add(task, after=group)``).

Every node is an ordinary task of the graph's pipeline (``pipeline_run_id``, shown whole by
``chongming-redis tasks --pipeline`` and the dashboard), created ``WAITING`` on its parents
(``submit(after=...)``): nodes added before it or tasks that already exist. An edge can only
point back, so a graph has no cycle by construction. ``submit()`` validates every node and
reads every outside parent before writing anything (``ParentNotFound``, ``InvalidParams``,
``UnknownTask``: nothing written), then creates the nodes in the order added, parents first:
on Redis one atomic script per 100 nodes (a graph of up to 100 nodes appears whole or not at
all; a bigger one in steps of 100, each step's parents written before it).

::

    wf = client.workflow()
    fetch = wf.group(("fetch", {"url": a}), ("fetch", {"url": b}))   # side by side
    merged = wf.add("merge", None, after=fetch)                      # once both succeeded
    wf.chain(("index", None), ("notify", None), after=[merged])       # one after the other
    handles = wf.submit()
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from chongming_redis.client.effects import Commit, Flow, GetTask, Now, Nudge
from chongming_redis.client.flows import not_before_of
from chongming_redis.errors import ParentNotFound
from chongming_redis.model import TaskSnapshot, Transition
from chongming_redis.runtime import submission
from chongming_redis.runtime.notify import WORK
from chongming_redis.validation import check_identifier

if TYPE_CHECKING:
    from chongming_redis.client.flows import ClientFlows
    from chongming_redis.runtime.app import TaskType

_MICROSECOND = timedelta(microseconds=1)

#: One step of ``chain``/``group``: ``(task, params)``, or ``(task, params, options)`` with
#: the options of ``Workflow.add``.
Step = tuple[Any, ...]


@dataclass(frozen=True)
class Node:
    """A task of a workflow, its id fixed when added (so later nodes can name it)."""

    task_id: str
    name: str


@dataclass
class _Spec:
    task: str | TaskType
    params: Any
    task_id: str
    after: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


class Workflow:
    """A graph of tasks built in memory and created by ``submit()`` (see the module)."""

    def __init__(
        self,
        flows: ClientFlows,
        run: Callable[[Workflow], Any],
        pipeline_run_id: str | None = None,
    ) -> None:
        """``run``: how the client drives ``submit_flow`` (``Client``: blocking, returns
        handles; ``AsyncClient``: a coroutine)."""
        self._flows = flows
        self._run = run
        self.pipeline_run_id = check_identifier(
            pipeline_run_id or f"wf-{secrets.token_hex(8)}", "pipeline_run_id"
        )
        self._specs: list[_Spec] = []
        self._ids: set[str] = set()
        self.submitted = False

    def add(
        self,
        task: str | TaskType,
        params: Any = None,
        *,
        after: Iterable[Any] = (),
        task_id: str | None = None,
        **options: Any,
    ) -> Node:
        """A node: ``task`` with ``params``, waiting for ``after`` (nodes of this workflow,
        handles or ids of existing tasks). ``options``: ``Client.submit``'s ``key``, ``tags``,
        ``priority``, ``on_parent_failure``, ``retry``, ``timeout``, ``retention``,
        ``unique``, ``delay``."""
        if self.submitted:
            raise RuntimeError("this workflow was submitted already: build a new one")
        unknown = set(options) - _OPTIONS
        if unknown:
            raise TypeError(f"unknown workflow node options: {', '.join(sorted(unknown))}")
        new_id = check_identifier(task_id or secrets.token_hex(10), "task_id")
        if new_id in self._ids:
            raise ValueError(f"task id {new_id!r} is in this workflow already")
        name = task if isinstance(task, str) else task.name
        spec = _Spec(task, params, new_id, submission.parent_ids(after), dict(options))
        self._specs.append(spec)
        self._ids.add(new_id)
        return Node(new_id, name)

    def chain(self, *steps: Step, after: Iterable[Any] = ()) -> list[Node]:
        """Nodes that run one after the other (each after the one before; the first after
        ``after``)."""
        nodes: list[Node] = []
        previous: Sequence[Any] = tuple(after)
        for step in steps:
            nodes.append(self._step(step, previous))
            previous = [nodes[-1]]
        return nodes

    def group(self, *steps: Step, after: Iterable[Any] = ()) -> list[Node]:
        """Nodes side by side, each after ``after``; a node ``add``-ed ``after=`` the group is
        its join (a chord's body)."""
        parents = tuple(after)
        return [self._step(step, parents) for step in steps]

    def _step(self, step: Step, after: Sequence[Any]) -> Node:
        if not isinstance(step, tuple) or len(step) not in (2, 3):
            raise TypeError("a step is (task, params) or (task, params, {options})")
        options = step[2] if len(step) == 3 else {}
        return self.add(step[0], step[1], after=after, **options)

    @property
    def nodes(self) -> list[Node]:
        return [Node(s.task_id, s.task if isinstance(s.task, str) else s.task.name)
                for s in self._specs]  # fmt: skip

    def submit(self) -> Any:
        """Create every node: their handles in the order added (``AsyncClient``: awaitable)."""
        return self._run(self)

    def submit_flow(self) -> Flow[list[str]]:
        """Create every node (see the module); the ids in the order added."""
        if self.submitted:
            raise RuntimeError("this workflow was submitted already")
        flows = self._flows
        outside = {p for s in self._specs for p in s.after if p not in self._ids}
        for parent in sorted(outside):  # read before anything is written
            found: TaskSnapshot | None = yield GetTask(parent)
            if found is None:
                child = next(s.task_id for s in self._specs if parent in s.after)
                raise ParentNotFound(child, parent)
        buckets = yield from flows._bucket_policy_flow()
        now: datetime = yield Now()
        items: list[tuple[TaskSnapshot, int | None, list[Transition]]] = []
        for spec in self._specs:
            options = dict(spec.options)
            delay = options.pop("delay", None)
            options = submission.with_parents(flows.store, {**options, "after": spec.after})
            name, task_type = yield from flows._resolve_flow(spec.task)
            yield from flows._params_flow(name, task_type, [spec.params])
            recorded = yield from flows._limits_flow(name, task_type)
            when = not_before_of(now, delay, None)
            new = submission.NewTask(name, spec.params, task_id=spec.task_id, not_before=when,
                                     pipeline_run_id=self.pipeline_run_id, **options)  # fmt: skip
            snapshot, transition = submission.new_task(new, task_type, now=now, buckets=buckets,
                                                       submitted_by=flows.name,
                                                       recorded_limits=recorded)  # fmt: skip
            items.append((snapshot, None, [transition]))
            now = max((yield Now()), now + _MICROSECOND)  # listings keep the order added
        if not items:
            return []
        self.submitted = True
        errors = yield Commit(items)
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error
        yield Nudge(WORK)
        return [s.task_id for s in self._specs]


_OPTIONS = frozenset({"key", "tags", "priority", "on_parent_failure", "retry", "timeout",
                      "retention", "unique", "delay"})  # fmt: skip
