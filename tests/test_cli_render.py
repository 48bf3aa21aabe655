"""The pieces the CLI prints with, in process: durations, labelled local/UTC times, progress
bars, bucket ranges, redacted URLs, the progress bar of long operations (drawn only when
asked: a terminal, never a pipe or CI) and the JSON of stored values."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from rich.console import Console

from chongming_redis.cli.common import progress, show_progress, shown_url
from chongming_redis.cli.json_output import plain
from chongming_redis.cli.render import labelled_time, progress_bar, ranges, relative, span
from chongming_redis.model import Progress

NOW = datetime(2026, 7, 1, 12, 0, 0, tzinfo=timezone.utc)


@pytest.fixture
def tokyo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.04, "0.0 s"), (0.4, "0.4 s"), (9.94, "9.9 s"), (12, "12 s"), (60, "1 min"),
     (243, "4 min 3 s"), (7500, "2 h 5 min"), (3 * 86400 + 4 * 3600 + 5, "3 d 4 h")],
)  # fmt: skip
def test_span(seconds: float, text: str) -> None:
    assert span(seconds) == text


def test_relative_says_ago_or_in() -> None:
    assert relative(NOW - timedelta(seconds=3), NOW) == "3.0 s ago"
    assert relative(NOW + timedelta(seconds=27), NOW) == "in 27 s"


def test_a_moment_is_labelled_in_local_time_and_utc(tokyo: None) -> None:
    moment = NOW - timedelta(seconds=30)
    assert labelled_time(moment, NOW) == "2026-07-01 20:59:30 JST (11:59:30 UTC, 30 s ago)"
    late = datetime(2026, 7, 1, 20, 0, tzinfo=timezone.utc)  # the next day in Tokyo
    assert labelled_time(late, NOW).startswith("2026-07-02 05:00:00 JST (2026-07-01 20:00:00 UTC")


def test_in_utc_a_moment_is_labelled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert (
            labelled_time(NOW, NOW + timedelta(minutes=2)) == "2026-07-01 12:00:00 UTC (2 min ago)"
        )
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    ("progress", "text"),
    [
        (None, ""),
        (Progress(5), "5"),
        (Progress(2.5, None), "2.5"),
        (Progress(0, 10), "░░░░░░░░░░   0% 0/10"),
        (Progress(3, 4), "███████░░░  75% 3/4"),
        (Progress(10, 10), "██████████ 100% 10/10"),
        (Progress(12, 10), "██████████ 100% 12/10"),
        (Progress(1, 0), "1"),
    ],
)
def test_progress_bar(progress: Progress | None, text: str) -> None:
    assert progress_bar(progress).plain == text


def test_ranges() -> None:
    assert ranges([]) == ""
    assert ranges([7, 0, 1, 2, 3, 9, 10, 3]) == "0-3, 7, 9-10"


def test_a_password_is_never_shown() -> None:
    assert shown_url("redis://app:s3cret@db.example:6380/2") == "redis://app:***@db.example:6380/2"
    assert shown_url("redis://:s3cret@db.example/0") == "redis://:***@db.example/0"
    assert shown_url("unix:///tmp/r.sock") == "unix:///tmp/r.sock"


def test_the_progress_bar_draws_only_when_shown() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=80)
    with progress("pruning", 10, shown=True, to=console) as advance:
        advance(4)
        advance(6)
    assert "pruning" in screen.getvalue() and "10/10" in screen.getvalue()
    quiet = io.StringIO()
    with progress("pruning", 10, shown=False, to=Console(file=quiet)) as advance:
        advance(10)
    assert quiet.getvalue() == ""


def test_no_progress_bar_in_ci_or_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not show_progress()  # pytest's stderr is not a terminal
    monkeypatch.setenv("CI", "true")
    assert not show_progress()


def test_stored_values_as_json() -> None:
    assert plain({"a": [1, b"\x01", (2, 3)], b"k": None}) == {
        "a": [1, {"base64": "AQ=="}, [2, 3]],
        "k": None,
    }
