"""Every Redis key of a namespace, built in one place.

All keys start with the namespace's hash tag ``{ns}:`` so a namespace lives in one cluster slot
and every script's keys share it. After the tag comes a *kind* that names the structure, then
(for per-record keys) the caller's identifier verbatim:

====================  ======  =================================================================
key                   type    meaning
====================  ======  =================================================================
``{ns}:t:<id>``       hash    one task (short field names, see ``TASK_FIELDS``)
``{ns}:h:<id>``       zset    the task's history; score = version, member = msgpack entry
``{ns}:c:<cid>``      hash    one control command (``COMMAND_FIELDS``)
``{ns}:tc:<id>``      zset    the commands submitted for task ``id``; score = created_at (µs),
                              member = command id. Dropped with the task by ``prune`` (the
                              command hashes stay)
``{ns}:ix:<st>:<b>:<name>``  zset  tasks of status ``st`` in bucket ``b`` named ``name``;
                              score = created_at (µs). The one composite index behind the
                              status, bucket, name and name-prefix filters
``{ns}:nm:<st>:<b>``  hash    name -> number of tasks in ``ix:<st>:<b>:<name>``
``{ns}:rq:<b>:<name>``  zset  due PENDING tasks in start order (``lua/lib/indexes.lua``)
``{ns}:dq:<b>:<name>``  zset  PENDING tasks with a not_before; score = not_before (µs)
``{ns}:rh:<name>``    zset    bucket -> the best score of ``rq:<b>:<name>`` (``dh``: of dq)
``{ns}:tag:<tag>``    zset    tasks carrying ``tag`` (exact); score = created_at
``{ns}:p:<pid>``      zset    tasks of pipeline run ``pid``; score = created_at
``{ns}:uq:<unique>``  string  the id of the unfinished task holding the unique id ``unique``
                              (``lua/lib/policies.lua``), written and dropped by the script
                              that moves the task
``{ns}:expiry``       zset    finished tasks with a retention; score = updated_at + retention
                              (µs), when ``expire_finished`` may remove them
``{ns}:limits``       hash    limit id -> definition JSON (``record_limits``)
``{ns}:limit-types``  hash    task type -> JSON list of its limit ids
``{ns}:schemas``      hash    task type -> ``{"at": µs, "schema": JSON Schema text}``, the
                              parameter schema its newest worker published
``{ns}:lh:<ref>``     set     the tasks RUNNING or PAUSED naming the limit ref
                              (``lua/lib/limits.lua``)
``{ns}:tb:<ref>``     hash    a rate ref's token bucket: ``tokens``, ``at`` (µs); expires once full
``{ns}:lp:<ref>``     zset    a concurrency ref's parked PENDING tasks (out of their ready queue
                              while it is full); score = their rq score
``{ns}:ln:<ref>``     zset    the parked tasks no start has passed over yet (not waiters yet)
``{ns}:lw:<ref>``     zset    the tasks a start passed over for the ref; score = their version
``{ns}:lf``           set     the refs a holder left since the last start (unparked by it)
``{ns}:lpc``          hash    ``<b>:<name>`` → its parked tasks (the start-order upgrade's check)
``{ns}:lrefs``        set     the refs that may have a holder, a parked task or a waiter
``{ns}:counts``       hash    ``<st>`` and ``<st>:<b>`` → number of tasks
``{ns}:cq``           zset    unfinished, unleased commands; score = created_at
``{ns}:cl``           zset    leased, unfinished commands; score = lease_until (µs)
``{ns}:cr:<token>``   list    the command ids one ``claim_commands`` call leased (retry memo)
``{ns}:sr:<token>``   list    the task ids one ``start_tasks`` call started (retry memo)
``{ns}:workers``      zset    live pool workers; score = heartbeat expiry (ms)
``{ns}:worker-beat``  hash    worker -> the ``now`` (ms) of its last ``pool_tick``; the same
                              workers as ``{ns}:workers`` (written in the same step)
``{ns}:bucket-owner`` hash    bucket -> the worker holding its lease
``{ns}:bucket-until`` hash    bucket -> that lease's expiry (ms)
``{ns}:meta``         hash    ``num_buckets`` recorded by the first worker; ``so`` once the
                              start queues hold every PENDING task
``{ns}:feed``         hash    the change feed: ``head`` (last position issued, never reused),
                              ``tombs`` (tombstones kept)
``{ns}:fc:<n>``       hash    feed chunk ``n``: position -> ``t<id>`` (a live task at its latest
                              position) or ``r<tombstone>``; positions ``128n .. 128n+127``
``{ns}:fcs``          zset    the feed chunks that hold items; score = member = ``n``
``{ns}:audit``        stream  command lease audit (only with ``audit=True``): one entry
                              ``op claim|complete|release cid until now [lu] owner`` per
                              lease change, written by the changing script; capped ~1,000,000
``{ns}:wait``         string  empty; only on Redis Cluster with ``durability_replicas``: the
                              barrier written before each ``WAIT`` (``_redis.durability``)
====================  ======  =================================================================

Why identifiers are safe verbatim: the hash tag is the *first* ``{...}`` of a key, and it comes
before any identifier, so an id containing ``{x}`` cannot move the key to another slot. Every
kind is a fixed word followed by ``:`` (or a fixed word with no identifier at all), and no kind
is a prefix of another kind followed by ``:``, so the kind of a key is decided before the
identifier starts: ``t:x:history`` is the task ``x:history``, never the history of ``x``.
Namespaces are restricted to ``[A-Za-z0-9_.-]`` so they cannot contain ``{``, ``}`` or ``:``.

Scripts that only learn an index key from stored data (the old tags of a task being saved)
derive it from ``root`` — the ``{ns}:`` prefix, passed as a KEY — and say so in their header.
The root is never written, so it never exists: a script that derives keys declares it and at
least one other key, and Redis Cluster refuses such a script (``TRYAGAIN``) while the slot
migrates instead of running it on a half-moved slot (``_redis.cluster``).
"""

from __future__ import annotations

import re

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

#: codec column -> hash field of ``{ns}:t:<id>``. ``task_id`` is the key itself; ``w`` (not a
#: column) is the token of the last create/save, which lets a retried write see "already done";
#: ``fs`` (not a column) is the task's change-feed position (``lua/lib/feed.lua``). ``g`` is
#: left out for a task without tags (read as ``[]``).
TASK_FIELDS: dict[str, str] = {
    "name": "n",
    "status": "s",
    "status_version": "v",
    "created_at": "c",
    "updated_at": "u",
    "tags": "g",
    "bucket": "b",
    "key": "k",
    "pipeline_run_id": "p",
    "params": "a",
    "result": "r",
    "progress_current": "pc",
    "progress_total": "pt",
    "progress_message": "pm",
    "failure_type": "ft",
    "failure_message": "fm",
    "failure_traceback": "fb",
    "heartbeat_at": "hb",
    "lease_owner": "lo",
    "lease_until": "lu",
    "attempt": "at",
    "not_before": "nb",
    "priority": "pr",
    # The task policies (``chongming_redis.policy``): absent (``None``) on a task written
    # before them. Seconds as Python's ``repr`` of a float, the deadline in µs.
    "retry_policy": "rt",
    "timeout_s": "to",
    "deadline": "dl",
    "retention_s": "rn",
    "unique_id": "uq",
    # The limit refs (``chongming_redis.limits``) as a JSON list; absent: none.
    "limit_refs": "lm",
    # The parents (``chongming_redis.parents``) as a JSON list and ``"run"``; absent: none,
    # and "stop".
    "parents": "dp",
    "on_parent_failure": "df",
}
TASK_COLUMNS_BY_FIELD: dict[str, str] = {f: c for c, f in TASK_FIELDS.items()}

#: codec column -> hash field of ``{ns}:c:<cid>``.
COMMAND_FIELDS: dict[str, str] = {
    "command_id": "id",
    "task_id": "t",
    "kind": "k",
    "created_at": "c",
    "issued_by": "i",
    "payload": "y",
    "lease_until": "lu",
    "finished_at": "f",
    "outcome": "o",
}
COMMAND_COLUMNS_BY_FIELD: dict[str, str] = {f: c for c, f in COMMAND_FIELDS.items()}


def check_namespace(namespace: object) -> str:
    if type(namespace) is not str:
        raise TypeError(f"namespace must be a str, not {type(namespace).__name__}")
    if not _NAMESPACE.fullmatch(namespace):
        raise ValueError(
            f"namespace {namespace!r} must be 1-64 characters of letters, digits, '_', '.', '-'"
        )
    return namespace


class Keys:
    """The key builder of one namespace. Nothing else in the package spells a key."""

    def __init__(self, namespace: str) -> None:
        self.namespace = check_namespace(namespace)
        self.root = "{" + namespace + "}:"
        self.counts = self.root + "counts"
        self.command_queue = self.root + "cq"
        self.command_leases = self.root + "cl"
        self.workers = self.root + "workers"
        self.worker_beats = self.root + "worker-beat"
        self.bucket_owner = self.root + "bucket-owner"
        self.bucket_until = self.root + "bucket-until"
        self.meta = self.root + "meta"
        self.types = self.root + "types"
        self.audit = self.root + "audit"
        self.feed = self.root + "feed"
        self.feed_chunks = self.root + "fcs"
        self.expiry = self.root + "expiry"
        #: The dependencies (``lua/lib/dependencies.lua``): ended parents whose end is still
        #: to be applied (zset), and the final tasks an unfinished child keeps (set).
        self.releases = self.root + "drel"
        self.pinned = self.root + "dpin"
        self.limits = self.root + "limits"
        self.limit_types = self.root + "limit-types"
        # The parameter schemas the workers published (TaskSchemasStore, _redis/task_schemas).
        self.task_schemas = self.root + "schemas"
        # The refs that may have a holder, a parked task or a waiter (limit_usage's list).
        self.limit_refs = self.root + "lrefs"
        self.limit_freed = self.root + "lf"
        # Every schedule: 'v:<id>' its version, 's:<id>' its state (lua/write_schedule.lua).
        self.schedules = self.root + "schedules"

    def task(self, task_id: str) -> str:
        return self.root + "t:" + task_id

    def history(self, task_id: str) -> str:
        return self.root + "h:" + task_id

    def command(self, command_id: str) -> str:
        return self.root + "c:" + command_id

    def task_commands(self, task_id: str) -> str:
        """The ids of the commands submitted for a task (``CommandInspectingStore``)."""
        return self.root + "tc:" + task_id

    def index(self, status: str, bucket: int, name: str) -> str:
        """The composite index entry of a task; ``name`` comes last, so it may hold ``:``."""
        return f"{self.root}ix:{status}:{bucket}:{name}"

    def bucket_names(self, status: str, bucket: int) -> str:
        return f"{self.root}nm:{status}:{bucket}"

    def tag(self, tag: str) -> str:
        return self.root + "tag:" + tag

    def pipeline(self, pipeline_run_id: str) -> str:
        return self.root + "p:" + pipeline_run_id

    def unique(self, unique: str) -> str:
        """The record of a unique id: the task that holds it (``TaskPoliciesStore``)."""
        return self.root + "uq:" + unique

    def limit_holders(self, ref: str) -> str:
        """The tasks holding a slot of a concurrency limit ref (``lua/lib/limits.lua``)."""
        return self.root + "lh:" + ref

    def token_bucket(self, ref: str) -> str:
        return self.root + "tb:" + ref

    def limit_parked(self, ref: str) -> str:
        """A concurrency ref's parked tasks, out of the ready queues while it is full."""
        return self.root + "lp:" + ref

    def limit_unseen(self, ref: str) -> str:
        """The parked tasks of a ref no start has passed over yet (not waiters yet)."""
        return self.root + "ln:" + ref

    def limit_waiters(self, ref: str) -> str:
        """The tasks a start passed over because of the ref; score = the version it saw."""
        return self.root + "lw:" + ref

    def feed_chunk(self, n: int) -> str:
        return f"{self.root}fc:{n}"

    def claim_memo(self, token: str) -> str:
        return self.root + "cr:" + token

    def start_memo(self, token: str) -> str:
        return self.root + "sr:" + token

    def nudge(self, topic: str) -> str:
        """The pub/sub channel of a nudge (``runtime/notify.py``): ``work``, ``pool``, or the
        name of the worker that holds a task."""
        return self.root + "nudge:" + topic

    @property
    def wait_barrier(self) -> str:
        """The channel ``durability_replicas`` publishes to before each ``WAIT``
        (``_redis.durability``); nobody subscribes. Under ``nudge:`` so the nudges' ACL
        channel pattern covers it; ``!`` keeps it apart from any worker's name."""
        return self.root + "nudge:!wait"

    @property
    def wait_barrier_key(self) -> str:
        """The key ``durability_replicas`` writes before each ``WAIT`` on Redis Cluster, where
        ``PUBLISH`` is not replicated (``_redis.durability.write_barrier``): in the namespace's
        slot, so the barrier runs on the node that ran the write."""
        return self.root + "wait"

    def glob(self) -> str:
        """The ``SCAN MATCH`` pattern of every key of the namespace (glob-escaped)."""
        return _glob_escape(self.root) + "*"

    def pattern(self) -> str:
        """The ACL key pattern that covers the namespace."""
        return "~" + self.glob()

    def channel_pattern(self) -> str:
        """The ACL channel pattern of the namespace's nudges (``{ns}:nudge:<topic>``: the
        store's creates publish ``work``, the runtime the others)."""
        return "&" + _glob_escape(self.root) + "nudge:*"


def _glob_escape(text: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)
