"""The page's JSON shape: ``docs/feed-page.schema.json`` accepts the valid examples of
``docs/feed-examples`` and what ``page_to_json`` makes of real pages, and refuses every invalid
example (each named after what is wrong with it)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest

from chongming_redis import (
    Failure,
    InMemoryTaskStore,
    Progress,
    TaskSnapshot,
    TaskStatus,
)
from chongming_redis.feed import page_to_json
from chongming_redis.feed.wire import dumps

DOCS = Path(__file__).resolve().parents[1] / "docs"
SCHEMA = json.loads((DOCS / "feed-page.schema.json").read_text("utf-8"))
EXAMPLES = sorted((DOCS / "feed-examples").glob("*.json"))
T0 = datetime(2024, 3, 10, 12, 0, 0, 1, tzinfo=timezone.utc)


def validator() -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    return jsonschema.Draft202012Validator(SCHEMA)


def test_there_are_valid_and_invalid_examples() -> None:
    names = [p.name for p in EXAMPLES]
    assert sum(n.startswith("valid-") for n in names) >= 2
    assert sum(n.startswith("invalid-") for n in names) >= 6


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_is_judged_as_its_name_says(path: Path) -> None:
    errors = list(validator().iter_errors(json.loads(path.read_text("utf-8"))))
    if path.name.startswith("valid-"):
        assert errors == []
    else:
        assert errors, f"{path.name} should be refused"


def test_real_pages_match_the_schema_and_survive_json() -> None:
    store = InMemoryTaskStore()
    store.create(TaskSnapshot("a", "etl", TaskStatus.RUNNING, 2, T0, T0, tags=frozenset({"x"}),
                              progress=Progress(1.5, None, "ü"), lease_owner="w",
                              lease_until=T0, heartbeat_at=T0, not_before=T0))  # fmt: skip
    store.create(TaskSnapshot("b", "mail", TaskStatus.FAILED, 3, T0, T0, failure=Failure("E", "m")))
    store.create(TaskSnapshot("🙂", "x", TaskStatus.LOST, 1, T0, T0, bucket=2**31 - 1))
    store.prune(keep_terminal=1)
    for limit in (1, 2, 256):
        cursor = "0"
        while (page := store.changes(cursor, limit)).tasks:
            encoded = page_to_json(page)
            assert list(validator().iter_errors(json.loads(dumps(encoded)))) == []
            assert [t["task_id"] for t in encoded["tasks"]] == [t.task_id for t in page.tasks]
            cursor = page.next_cursor
        assert validator().is_valid(page_to_json(page))


def test_a_page_over_256_items_is_refused() -> None:
    item = json.loads((DOCS / "feed-examples" / "valid-page.json").read_text())["tasks"][0]
    assert not validator().is_valid({"tasks": [item] * 257, "next_cursor": "300"})
    assert validator().is_valid({"tasks": [item] * 256, "next_cursor": "300"})
