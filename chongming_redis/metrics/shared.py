"""One ``/metrics`` for the children of a ``--processes`` parent: prometheus-client's
multiprocess mode.

Each forked child writes its series to files of its own (named by its pid) in one directory,
and the parent's endpoint sums them at every scrape (``worker.shared_registry``). A child that
exits leaves its counters' and histograms' files behind, so a restarted child (a new pid, new
files from 0) never makes the sum go back; ``worker.child_exited`` drops its gauges' files
(``livesum``: only live children count).

prometheus-client picks its mode when it is first imported, from ``PROMETHEUS_MULTIPROC_DIR``:
``shared_between_processes`` sets it before anything imports ``prometheus_client`` (the app
included: its own metrics are then summed too), so this module never imports it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "PROMETHEUS_MULTIPROC_DIR"


@contextmanager
def shared_between_processes() -> Iterator[str]:
    """A fresh directory for the series of this process's children, named in ``ENV`` for them
    (they inherit it when forked); the variable is restored and the directory removed at the
    end. ``ValueError`` when ``prometheus_client`` is already loaded in single-process mode:
    the children would then keep their series to themselves."""
    values = sys.modules.get("prometheus_client.values")
    if values is not None and not getattr(values.ValueClass, "_multiprocess", False):
        raise ValueError(
            "prometheus_client was imported before the worker set PROMETHEUS_MULTIPROC_DIR: "
            "the processes' metrics cannot be summed"
        )
    before = os.environ.get(ENV)
    path = tempfile.mkdtemp(prefix="chongming-metrics-")
    os.environ[ENV] = path
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
        shutil.rmtree(path, ignore_errors=True)
