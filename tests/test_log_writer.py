"""``BatchingHandler``: every line written, in order, from many threads; arguments that could
change are formatted when logged; a forked child writes its own lines; close flushes."""

from __future__ import annotations

import io
import logging
import os
import threading
from pathlib import Path

from chongming_redis.cli.log_writer import BatchingHandler, SecondsFormatter


def make_logger(
    stream: io.TextIOBase | io.StringIO, name: str
) -> tuple[logging.Logger, BatchingHandler]:
    handler = BatchingHandler(stream)  # type: ignore[arg-type]
    handler.setFormatter(SecondsFormatter("%(asctime)s %(levelname)s %(message)s",
                                          datefmt="%H:%M:%S"))  # fmt: skip
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, handler


def test_every_line_from_many_threads_is_written_once_in_each_threads_order() -> None:
    stream = io.StringIO()
    logger, handler = make_logger(stream, "lw.threads")

    def emit(thread: int) -> None:
        for i in range(2000):
            logger.info("t%d line %d", thread, i)

    threads = [threading.Thread(target=emit, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    handler.flush()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 8000
    for n in range(4):
        mine = [int(line.rsplit(" ", 1)[1]) for line in lines if f" t{n} line " in line]
        assert mine == list(range(2000))
    assert all(line.split(" ")[1] == "INFO" for line in lines)
    handler.close()


def test_a_mutable_argument_is_formatted_when_logged_not_when_written() -> None:
    stream = io.StringIO()
    logger, handler = make_logger(stream, "lw.mutable")
    found = ["a"]
    logger.info("lost: %s", found)
    found.append("b")  # after the call: the line shows what was logged
    handler.flush()
    assert stream.getvalue().rstrip().endswith("lost: ['a']")
    handler.close()


def test_a_message_with_line_breaks_is_one_line_and_a_traceback_keeps_its_lines() -> None:
    """libpq's errors hold newlines; a worker's log line quoting one stays one line."""
    stream = io.StringIO()
    logger, handler = make_logger(stream, "lw.breaks")
    error = ("server closed the connection unexpectedly\n\tThis probably means the server "
             "terminated abnormally\n\tbefore or while processing the request.")  # fmt: skip
    logger.warning("cannot claim commands: %s (summarised)", error)
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    handler.flush()
    first, *rest = stream.getvalue().splitlines()
    assert first.endswith(
        "WARNING cannot claim commands: server closed the connection unexpectedly This probably "
        "means the server terminated abnormally before or while processing the request. "
        "(summarised)"
    ), first
    assert rest[0].endswith("ERROR failed") and rest[1] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"
    handler.close()


def test_close_writes_what_is_queued_and_a_forked_child_writes_its_own_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.txt"
    with open(path, "w") as stream:
        logger, handler = make_logger(stream, "lw.fork")
        logger.info("parent before fork")
        handler.flush()
        pid = os.fork()
        if pid == 0:  # the child: the parent's writer thread did not survive the fork
            logger.info("child line")
            handler.close()
            os._exit(0)
        os.waitpid(pid, 0)
        for i in range(100):
            logger.info("parent after %d", i)
        handler.close()  # no flush first: close writes everything queued
    text = path.read_text().splitlines()
    assert sum("child line" in line for line in text) == 1
    assert sum("parent before fork" in line for line in text) == 1
    assert [line for line in text if "parent after" in line][-1].endswith("parent after 99")
