"""The namespace of a stress run on a given Redis (``--redis URL``): refused if it holds data,
deleted at the end; and ``StressError``, the run's refusal of its options or its Redis."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from chongming_redis.stress import app as stress_app
from chongming_redis.stress.clients import client_for


class StressError(RuntimeError):
    """The run cannot start (e.g. the namespace given already holds data)."""


def require_empty(url: str, namespace: str, cluster: bool = False) -> None:
    """The run writes into the namespace and deletes it afterwards: never one that holds data."""
    client = client_for(url, cluster=cluster, socket_timeout=5, socket_connect_timeout=5)
    try:
        for pattern in (_escaped("{" + namespace + "}:*"), stress_app.keys_pattern(namespace)):
            for _ in client.scan_iter(match=pattern, count=1000):
                raise StressError(
                    f"namespace {namespace!r} already holds data on {_safe(url)}; the stress run "
                    "needs a namespace of its own (it deletes it at the end)"
                )
    finally:
        client.close()


def _escaped(pattern: str) -> str:
    return pattern.replace("{", "\\{").replace("}", "\\}")


def _safe(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def delete_namespace(url: str, namespace: str, cluster: bool = False) -> None:
    client = client_for(url, cluster=cluster)
    for pattern in (_escaped("{" + namespace + "}:*"), stress_app.keys_pattern(namespace)):
        for key in client.scan_iter(match=pattern, count=500):
            client.delete(key)
    client.close()
