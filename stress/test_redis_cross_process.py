"""kill -9 of redis-server under a mixed write load from real processes (store guide §6,
RELIABILITY F1/F4 and Checkers): every acknowledged write survives the restart, nothing is
half-applied, and whatever else was found is explained by an indeterminate op.

The store-neutral cross-process proofs (8 processes saving one version, 8 consumers draining
1,000 commands, a SIGKILLed claimer's leases) run on Redis and on SQLite in
stress/test_cross_process.py.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from chongming_redis.model import (
    Command,
    TaskQuery,
    TaskStatus,
)
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.processes import read_lines, spawner
from tests.support.redis_server import RedisProc
from tests.support.workers import command, submit_all

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(90)]


# -- helpers ------------------------------------------------------------------------------


def raw_command(s: RedisTaskStore, client: redis.Redis, command_id: str) -> Command:
    """A command as stored (the protocol has no getter for one)."""
    fields = client.hgetall(s.keys.command(command_id))
    assert fields, f"command {command_id} is missing"
    return s._decode_command(command_id, fields)


# -- kill -9 of redis-server under load ------------------------------------------------------

WRITERS = 4
LOAD_SECONDS = 1.5
LOAD_COMMANDS = 600


def test_kill9_of_redis_under_load_loses_no_acknowledged_write(
    fresh_redis_proc: RedisProc, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    server = fresh_redis_proc
    setup = RedisTaskStore.from_url(server.url, namespace=namespace)
    try:
        commands = [command(i) for i in range(LOAD_COMMANDS)]
        submit_all(setup, commands)
    finally:
        setup.close()
    names = [f"writer{i}" for i in range(WRITERS)]
    logs = {name: tmp_path / f"{name}.jsonl" for name in names}
    with spawner(tmp_path) as spawned:
        writers = [
            spawned.start(
                "writer",
                name,
                *("--url", server.url, "--namespace", namespace),
                *("--seed", str(i), "--out", str(logs[name]), "--max-seconds", "20"),
            )
            for i, name in enumerate(names)
        ]
        for w in writers:
            assert w.read_json() == {"ready": w.name}
        for w in writers:
            w.send("go")
        time.sleep(LOAD_SECONDS)
        for w in writers:
            assert w.proc.poll() is None, f"{w.name} stopped before the kill; {w.stderr()}"
        kill_started = time.monotonic()
        server.kill9()
        kill_done = time.monotonic()
        spawned.wait_all(20)  # each writer sees StoreUnavailable and exits
    stopped_at = time.monotonic()
    server.restart()
    restarted = time.monotonic() - stopped_at

    records = {name: read_lines(path) for name, path in logs.items()}
    acked = [r for name in names for r in records[name] if r["outcome"] == "ok"]
    unknown = [r for name in names for r in records[name] if r["outcome"] != "ok"]
    # The kill happened mid-load: every writer was acknowledged before it, and every writer's
    # only failure is a StoreUnavailable after it (its last op; it then stopped).
    for name in names:
        mine = records[name]
        assert any(r["outcome"] == "ok" and r["t1"] < kill_started for r in mine), name
        assert [r["outcome"] for r in mine].count("ok") == len(mine) - 1, name
        last = mine[-1]
        assert last["outcome"] == "info" and last.get("unavailable"), last
        assert last["t1"] > kill_started, f"{name} failed before the kill: {last}"
    # An op that only began after the server was dead cannot have been acknowledged. (Its
    # end time says nothing: a writer may be descheduled between the reply and its clock read.)
    assert all(r["t0"] <= kill_done for r in acked), "an op was acknowledged by a dead server"

    store = RedisTaskStore.from_url(server.url, namespace=namespace)
    client = server.client(socket_timeout=5)
    try:
        found = check_durability(store, client, acked, unknown, commands)
    finally:
        store.close()
        client.close()
    ops = Counter(r["op"] for r in acked)
    print(
        f"\n[kill -9 redis] {WRITERS} writers, acked before the kill: {sum(ops.values())} ops"
        f" {dict(sorted(ops.items()))}; indeterminate (StoreUnavailable, one per writer):"
        f" {found['fates']}; after restart: {found['tasks']} tasks,"
        f" {found['versions_checked']} acked saves <= stored version,"
        f" {found['history']} acked appends in history, {found['leased']} acked leases held,"
        f" {found['finished']} acked completions finished; indexes and counts agree;"
        f" restart {restarted:.2f}s, total {time.monotonic() - started:.2f}s"
    )


def check_durability(
    store: RedisTaskStore,
    client: redis.Redis,
    acked: list[dict[str, Any]],
    unknown: list[dict[str, Any]],
    commands: list[Command],
) -> dict[str, Any]:
    """RELIABILITY Checkers/durability: acknowledged ⊆ recovered, and recovered minus
    acknowledged ⊆ indeterminate. Returns counts for the report."""
    # Every write of a task, by version: what the writer sent (acked or indeterminate).
    written: dict[str, dict[int, dict[str, Any]]] = {}
    for r in acked + unknown:
        if r["op"] in ("create", "save"):
            written.setdefault(r["task"], {})[r["version"]] = r
    acked_version: dict[str, int] = {}
    for r in acked:
        if r["op"] in ("create", "save"):
            acked_version[r["task"]] = max(acked_version.get(r["task"], 0), r["version"])
    unknown_versions = {(r["task"], r["version"]) for r in unknown if r["op"] in ("create", "save")}

    # Tasks: every acked create is there; the stored version is the last acked one or a later
    # indeterminate one, and the stored snapshot is what was sent for that version.
    stored_tasks = {t.task_id: t for t in store.query()}
    for task_id, versions in written.items():
        got = store.get(task_id)
        if task_id in acked_version:
            assert got is not None, f"acknowledged create of {task_id} lost"
            assert got.status_version >= acked_version[task_id], (task_id, got.status_version)
        if got is None:
            assert (task_id, 1) in unknown_versions, f"{task_id} neither acked nor pending"
            continue
        v = got.status_version
        assert v == acked_version.get(task_id) or (task_id, v) in unknown_versions, (task_id, v)
        sent = versions[v]
        assert (got.status.value, got.bucket, got.result) == (
            sent["status"],
            sent["bucket"],
            {"v": v},
        ), (task_id, got)
        assert stored_tasks.get(task_id) == got, f"{task_id} is missing from query()"
    # Nothing exists that nobody wrote: every task hash in the namespace is one of ours.
    hashes = {
        key.decode()[len(store.keys.task("")) :]
        for key in client.scan_iter(match=store.keys.task("") + "*", count=1000)
    }
    assert hashes == set(stored_tasks) == {t for t in written if store.get(t) is not None}

    # Nothing half-applied: each task is found in the index of its own status and bucket and
    # in no other, and the counters (per status, and per status:bucket) equal what query()
    # returns.
    indexed: Counter[str] = Counter()
    for status in TaskStatus:
        for bucket in range(4):
            hits = store.query(TaskQuery(statuses=frozenset({status}), buckets=frozenset({bucket})))
            for hit in hits:
                assert (hit.status, hit.bucket) == (status, bucket), hit
                indexed[hit.task_id] += 1
    assert indexed == Counter(set(stored_tasks)), "a task is in no index or in two"
    by_status = Counter(t.status for t in stored_tasks.values())
    assert store.counts() == {s: by_status.get(s, 0) for s in TaskStatus}
    raw_counts = {
        k.decode(): int(v) for k, v in client.hgetall(store.keys.counts).items() if int(v) != 0
    }
    expected_counts = {s.value: n for s, n in by_status.items()}
    expected_counts.update(Counter(f"{t.status.value}:{t.bucket}" for t in stored_tasks.values()))
    assert raw_counts == expected_counts

    # History: every acked append is there, with what was sent.
    history_checked = 0
    for r in acked:
        if r["op"] == "append":
            entries = {h.version: h for h in store.history(r["task"])}
            assert r["version"] in entries, f"acknowledged append lost: {r}"
            assert entries[r["version"]].to_status.value == r["to"], (r, entries[r["version"]])
            history_checked += 1
    appended_unknown = {(r["task"], r["version"]) for r in unknown if r["op"] == "append"}
    acked_appends = {(r["task"], r["version"]) for r in acked if r["op"] == "append"}
    for task_id in written:
        for h in store.history(task_id):
            key = (task_id, h.version)
            assert key in acked_appends or key in appended_unknown, f"unexplained entry {key}"

    # Commands: an acked claim is still leased (lease_until >= acked) or finished; an acked
    # completion is finished with its outcome; each command is in exactly one of queue and
    # leases while unfinished, in neither once finished.
    queue = {m.decode() for m in client.zrange(store.keys.command_queue, 0, -1)}
    leases = {
        m.decode(): int(s)
        for m, s in client.zrange(store.keys.command_leases, 0, -1, withscores=True)
    }
    acked_lease: dict[str, int] = {}
    claimers: Counter[str] = Counter()
    for r in acked:
        if r["op"] == "claim":
            for cid, until in r["cmds"]:
                acked_lease[cid] = until
                claimers[cid] += 1
    assert not [c for c, n in claimers.items() if n > 1], "a command was claimed twice"
    completed = {r["cid"]: r["by"] for r in acked if r["op"] == "complete"}
    leased_held = finished = 0
    unexplained_leases = 0
    unexplained_finishes: set[str] = set()
    for c in commands:
        stored = raw_command(store, client, c.command_id)
        cid = c.command_id
        if stored.finished_at is not None:
            assert cid not in queue and cid not in leases, cid
            if cid in completed:
                assert stored.outcome == completed[cid], stored
                finished += 1
            else:
                unexplained_finishes.add(cid)
        else:
            assert cid not in completed, f"acknowledged completion lost: {cid}"
            assert (cid in queue) != (cid in leases), f"{cid} in queue and leases disagree"
            if cid in leases:
                assert stored.lease_until is not None
                assert leases[cid] == encode_dt(stored.lease_until), cid
                if cid not in acked_lease:
                    unexplained_leases += 1
        if cid in acked_lease and stored.finished_at is None:
            assert stored.lease_until is not None, f"acknowledged lease lost: {cid}"
            assert encode_dt(stored.lease_until) >= acked_lease[cid], cid
            leased_held += 1
    # Whatever was found beyond the acknowledged is explained by an indeterminate op.
    unknown_ops = Counter(r["op"] for r in unknown)
    assert unexplained_finishes <= {r["cid"] for r in unknown if r["op"] == "complete"}
    assert unexplained_leases <= 2 * unknown_ops["claim"]  # limit=2 per claim

    # The fate of each indeterminate op (RELIABILITY fact 3: a write whose reply was lost may
    # have been applied; either way it is all or nothing, as checked above).
    fates = []
    for r in unknown:
        if r["op"] in ("create", "save"):
            got = store.get(r["task"])
            done = got is not None and got.status_version == r["version"]
        elif r["op"] == "append":
            done = r["version"] in {h.version for h in store.history(r["task"])}
        elif r["op"] == "complete":
            done = r["cid"] in unexplained_finishes
        else:
            done = unexplained_leases > 0
        fates.append(f"{r['op']}:{'applied' if done else 'not applied'}")
    return {
        "fates": fates,
        "tasks": len(stored_tasks),
        "versions_checked": sum(
            1 for r in acked if r["op"] == "save" and r["task"] in stored_tasks
        ),
        "history": history_checked,
        "leased": leased_held,
        "finished": finished,
    }
