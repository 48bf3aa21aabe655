"""The worker command's metrics: ``--metrics-port`` checked, the series of a worker (or of
a ``--processes`` parent's children, shared through files) and their ``/metrics`` endpoint.
Prometheus is imported only when a port is given: a worker without metrics starts fast, and
needs no ``[metrics]`` extra (with a port and without the extra: one line naming it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from chongming_redis.cli.common import UserError
from chongming_redis.errors import require_extra

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

    from chongming_redis.runtime.app import App
    from chongming_redis.runtime.events import WorkerEvents


def check_metrics_port(port: int) -> int:
    """``--metrics-port``: 0 (no metrics) or a TCP port; another value is a ``UserError``, a
    port without the ``[metrics]`` extra a ``MissingExtra`` (found, not imported: a
    ``--processes`` parent sets prometheus-client's mode before it is first imported)."""
    if not 0 <= port <= 65535:
        raise UserError(f"--metrics-port must be a TCP port from 1 to 65535 (0: no metrics), "
                        f"not {port}")  # fmt: skip
    if port:
        require_extra("metrics", "--metrics-port")
    return port


@contextmanager
def metrics_shared(enabled: bool) -> Iterator[str | None]:
    """With ``enabled`` (a ``--processes`` parent serving metrics): the directory in which its
    children will write their series, set up before the app is imported (``metrics/shared.py``)
    and removed at the end; else ``None``."""
    if not enabled:
        yield None
        return
    from chongming_redis.metrics.shared import shared_between_processes

    with shared_between_processes() as path:  # a ValueError: one line (user_errors)
        yield path


def worker_metrics(host: str, port: int, app: App, *, serve: bool) -> WorkerEvents | None:
    """The worker's metrics (``None`` without ``--metrics-port``), served on their port unless
    a parent serves them (``serve=False``: the series go to the shared files)."""
    if not port:
        return None
    from prometheus_client import CollectorRegistry, disable_created_metrics

    from chongming_redis.metrics.worker import WorkerMetrics, worker_registry

    if not serve:  # the series go to this child's files; its registry is never read
        return WorkerMetrics(CollectorRegistry(), tasks=app.types)
    # No ``_created`` series beside each counter and histogram (this process is ours): as many
    # series again, and the --processes endpoint (multiprocess mode) has none either.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped there
    registry = worker_registry()
    serve_metrics(registry, host, port, say=logging.getLogger("chongming_redis.worker").info)
    return WorkerMetrics(registry, tasks=app.types)


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int, *, say: Callable[[str], None]
) -> WSGIServer:
    """``/metrics`` on ``--metrics-host:--metrics-port``, and ``say`` where; one line and
    exit 1 when the port is taken or the host is not this machine's."""
    from chongming_redis.metrics.worker import serve

    try:
        server = serve(registry, host, port)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    say(f"metrics on http://{f'[{host}]' if ':' in host else host}:{port}/metrics")
    return server
