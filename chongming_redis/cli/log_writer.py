"""``BatchingHandler``: log lines written by a thread of their own, in batches.

A worker logs two lines per task (start and end). Written directly — a format, a ``write`` and
a ``flush`` system call in the task's thread, under the handler's lock — they cost a worker
about 40 % of its no-op throughput (``bench.peers``: 6,300 -> 3,800 tasks/s with one
process): the system calls release the GIL and every one hands it to another thread. Here a
task thread only puts the record on a queue; the writer thread formats what has queued up and
writes it with one call. Lines appear within milliseconds, in order.

Fork-safe: a process forked after the first line (``chongming-redis worker --processes N``
configures logging, then forks) starts its own writer at its first line.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time
from typing import TextIO

#: Record arguments that cannot change between the call and the write: kept as they are.
_IMMUTABLE = (str, int, float, bool, type(None), bytes)
#: The most records one write carries.
_BATCH = 1000
#: A line break and the indentation around it (``one_line``).
_BREAK = re.compile(r"\s*\n\s*")


class SecondsFormatter(logging.Formatter):
    """A ``Formatter`` that renders each second's timestamp once (``time.strftime`` per line
    is a good part of a line's cost at thousands of lines a second)."""

    def __init__(self, fmt: str, datefmt: str) -> None:
        super().__init__(fmt, datefmt=datefmt)
        self._second = -1
        self._text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:  # one writer thread formats: no lock needed
            self._second, self._text = second, super().formatTime(record, datefmt)
        return self._text

    def formatMessage(self, record: logging.LogRecord) -> str:
        """One line per record: a message that quotes a driver's error may hold newlines
        (libpq's do); they become spaces. A traceback, appended after, keeps its lines."""
        text = super().formatMessage(record)
        return text if "\n" not in text else one_line(text)


def one_line(text: str) -> str:
    """``text`` with each line break, and the indentation around it, made one space."""
    return _BREAK.sub(" ", text.strip())


class BatchingHandler(logging.Handler):
    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self._pid = -1
        self._queue: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
        self._busy = threading.Event()  # the writer holds records not yet written
        self._thread: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self._pid != os.getpid():
            self._start()
        args = record.args
        if args and not all(isinstance(a, _IMMUTABLE) for a in args):
            # A list or an object could change before the writer formats it: format it now.
            record.msg, record.args = record.getMessage(), None
        self._queue.put(record)

    def _start(self) -> None:
        """A writer thread for this process (again after a fork: threads do not survive it)."""
        self._pid = os.getpid()
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        records = self._queue
        while True:
            first = records.get()
            self._busy.set()
            batch = [first]
            while len(batch) < _BATCH:
                try:
                    batch.append(records.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            lines = []
            for record in batch:
                if record is None:
                    continue
                try:
                    lines.append(self.format(record) + "\n")
                except Exception:
                    self.handleError(record)
            try:
                self.stream.write("".join(lines))
                self.stream.flush()
            except Exception:  # a closed or broken stream: like StreamHandler, say it once
                self.handleError(batch[0] or logging.makeLogRecord({}))
            if records.empty():
                self._busy.clear()
            if done:
                return

    def flush(self, timeout: float = 2.0) -> None:
        """Wait (at most ``timeout`` seconds) until every line logged so far is written."""
        if self._thread is None or self._pid != os.getpid():
            return
        deadline = time.monotonic() + timeout
        while (not self._queue.empty() or self._busy.is_set()) and time.monotonic() < deadline:
            time.sleep(0.001)

    def close(self) -> None:
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=2.0)
        super().close()
