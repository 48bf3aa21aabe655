"""``docs/grafana-dashboard.json`` imports into Grafana and queries only metrics that exist:
every ``chongming_*`` name in its queries is served by the dashboard's ``/metrics`` or by a
worker's ``--metrics-port`` (a renamed metric fails here, not silently on a user's screen)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from chongming_redis.dashboard import create_app
from chongming_redis.metrics.worker import WorkerMetrics
from chongming_redis.stores.memory import InMemoryTaskStore
from tests.support.dashboard import fill

DOC = Path(__file__).resolve().parents[1] / "docs" / "grafana-dashboard.json"


def served_names() -> set[str]:
    store = InMemoryTaskStore()
    fill(store, 3)  # a bucket or two, so the per-bucket families have samples
    with TestClient(create_app(store, namespace="g")) as web:
        text = web.get("/metrics").text
    names = set(re.findall(r"^(chongming_[a-z_]+)", text, re.MULTILINE))
    registry = CollectorRegistry()
    WorkerMetrics(registry, tasks=["t"])
    for family in registry.collect():
        names |= {sample.name for sample in family.samples}
    return names


def test_every_query_names_a_metric_that_is_served() -> None:
    board = json.loads(DOC.read_text("utf-8"))
    assert board["title"] and board["panels"] and board["schemaVersion"] >= 30
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"chongming_[a-z_]+", e)}
    assert used, "no query names a metric"
    served = served_names()
    # histogram_quantile reads the _bucket series the histogram exposes
    missing = sorted(n for n in used if n not in served)
    assert not missing, f"queried but never served: {missing}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert all(e.count("(") == e.count(")") for e in exprs)
