"""The store guide and the protocol name the same 14 methods, and §1 names every contract test.

``docs/store-guide.md`` §1 documents every ``TaskStore`` method in a Markdown table. Adding a
method to the protocol without documenting it, or documenting a name the protocol does not have,
fails here. The Chinese translation (``docs/zh/store-guide.md``, whose method table names its
column 方法) is held to the same rules: its table is what a Chinese reader checks a store against.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from chongming_redis.stores.protocol import PROTOCOL_METHODS, TaskStore
from chongming_redis.testing.store_contract import StoreContract

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDE = DOCS / "store-guide.md"
GUIDES = pytest.mark.parametrize("guide", [GUIDE, DOCS / "zh" / "store-guide.md"], ids=["en", "zh"])
_METHOD_COLUMN = ("method", "方法")
_SECTION_1 = re.compile(r"^## 1\. .*?$(.*?)^## ", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`([^`]+)`")
_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_TEST_NAME = re.compile(r"`(test_[a-z0-9_]+)`")


def protocol_members() -> set[str]:
    """The public callables defined on the Protocol class itself (not inherited ones)."""
    return {
        name
        for name, value in vars(TaskStore).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


def method_table_rows(text: str) -> list[list[str]]:
    """The body rows of the first table in §1 whose header has a ``method`` column."""
    section = _SECTION_1.search(text)
    assert section is not None, "docs/store-guide.md has no '## 1. ...' section"
    lines = [line.strip() for line in section.group(1).splitlines()]
    rows: list[list[str]] = []
    in_table = False
    for line in lines:
        if not line.startswith("|"):
            if in_table:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if not in_table:
            lowered = [c.lower() for c in cells]
            column = next((lowered.index(name) for name in _METHOD_COLUMN if name in lowered), None)
            if column is not None:
                in_table = True
                method_column = column
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        rows.append([cells[method_column]])
    assert rows, "§1 of docs/store-guide.md has no method table"
    return rows


def documented_methods(text: str) -> list[str]:
    names = []
    for (cell,) in method_table_rows(text):
        span = _CODE_SPAN.search(cell)
        assert span is not None, f"method cell without a `code span`: {cell!r}"
        match = _NAME.match(span.group(1))
        assert match is not None, f"method cell is not a call signature: {cell!r}"
        names.append(match.group(1))
    return names


def test_protocol_methods_lists_exactly_the_protocol_members() -> None:
    assert len(PROTOCOL_METHODS) == 14
    assert len(set(PROTOCOL_METHODS)) == len(PROTOCOL_METHODS)
    assert set(PROTOCOL_METHODS) == protocol_members()


@GUIDES
def test_the_guide_documents_every_protocol_method_and_nothing_else(guide: Path) -> None:
    documented = documented_methods(guide.read_text(encoding="utf-8"))
    assert len(documented) == len(set(documented)), f"documented twice: {documented}"
    assert set(documented) == set(PROTOCOL_METHODS)
    assert set(documented) == protocol_members()


@GUIDES
def test_the_guide_signatures_match_the_protocol_parameters(guide: Path) -> None:
    """Each documented signature names the protocol's parameters, in order."""
    text = guide.read_text(encoding="utf-8")
    for (cell,) in method_table_rows(text):
        signature = _CODE_SPAN.search(cell).group(1)  # type: ignore[union-attr]
        name = _NAME.match(signature).group(1)  # type: ignore[union-attr]
        inside = signature[signature.index("(") + 1 : signature.rindex(")")]
        documented = [p.split("=")[0].strip() for p in inside.split(",") if p.strip()]
        documented = [p for p in documented if p != "*"]
        expected = [p for p in inspect.signature(getattr(TaskStore, name)).parameters]
        assert documented == expected[1:], f"{name}: guide {documented}, protocol {expected[1:]}"


@GUIDES
def test_the_parser_notices_a_missing_and_an_unknown_method(guide: Path) -> None:
    text = guide.read_text(encoding="utf-8")
    without_prune = "\n".join(
        line for line in text.splitlines() if not (line.startswith("|") and "`prune(" in line)
    )
    assert "prune" not in documented_methods(without_prune)
    close_row = next(
        line for line in text.splitlines() if line.startswith("|") and "`close()`" in line
    )
    extra = text.replace(close_row, close_row + "\n| | `vacuum()` | not in the protocol | |")
    assert "vacuum" in documented_methods(extra)


def pinned_tests(text: str) -> list[str]:
    """Every ``test_...`` code span in §1 (the method table and the every-method table)."""
    section = _SECTION_1.search(text)
    assert section is not None
    return _TEST_NAME.findall(section.group(1))


@GUIDES
def test_section_1_names_every_contract_test_once_and_nothing_else(guide: Path) -> None:
    named = pinned_tests(guide.read_text(encoding="utf-8"))
    suite = {name for name in dir(StoreContract) if name.startswith("test_")}
    assert len(named) == len(set(named)), "a test is named twice in §1"
    assert suite - set(named) == set(), "contract tests not named in the guide's §1"
    assert set(named) - suite == set(), "names in the guide's §1 that are not contract tests"


@GUIDES
def test_every_method_row_names_at_least_one_test(guide: Path) -> None:
    section = _SECTION_1.search(guide.read_text(encoding="utf-8"))
    assert section is not None
    pinned: dict[str, list[str]] = {}
    for line in section.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        span = _CODE_SPAN.search(cells[1]) if len(cells) == 4 else None
        method = _NAME.match(span.group(1)) if span else None
        if method is not None:
            pinned[method.group(1)] = _TEST_NAME.findall(cells[3])
    assert set(pinned) == set(PROTOCOL_METHODS)
    assert all(pinned.values()), [name for name, tests in pinned.items() if not tests]
