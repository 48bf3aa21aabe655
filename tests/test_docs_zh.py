"""Each Chinese page keeps in step with its English one: the same headings level by level, in
the same order, and the same fenced code blocks (count, language tag, content byte for byte),
and each links to the other on its first line. An English change without its Chinese
counterpart (a section or an example added, removed or edited on one side) fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# English page -> its Chinese translation (paths relative to the repository's root).
PAIRS = {
    "README.md": "README.zh-CN.md",
    "docs/store-guide.md": "docs/zh/store-guide.md",
    "docs/runtime.md": "docs/zh/runtime.md",
}
# A fence may sit in a list item or a blockquote (``> ```python``): its prefix is kept in the
# block's content, so a block quoted on one side and not on the other differs.
_FENCE = re.compile(r"^(?:>[ \t]?|[ \t])*```(\S*)[ \t]*$")
_CLOSE = re.compile(r"^(?:>[ \t]?|[ \t])*```[ \t]*$")
_HEADING = re.compile(r"^(#{1,6}) \S")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def structure(text: str) -> tuple[list[tuple[int, str]], list[tuple[str, str]]]:
    """The headings outside code blocks, in order, as (level, line), and the code blocks as
    (language tag, the block's lines, fences included). An unclosed fence is an error, not a
    block that runs to the end of the page."""
    headings: list[tuple[int, str]] = []
    blocks: list[tuple[str, str]] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i].rstrip("\n"))
        if fence is None:
            heading = _HEADING.match(lines[i])
            if heading is not None:
                headings.append((len(heading.group(1)), lines[i].strip()))
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if _CLOSE.match(lines[j])), None)
        assert end is not None, f"unclosed code block at line {i + 1}"
        blocks.append((fence.group(1), "".join(lines[i : end + 1])))
        i = end + 1
    return headings, blocks


def differences(english: str, chinese: str) -> list[str]:
    """What keeps the two pages apart; empty when they are in step."""
    en_headings, en_blocks = structure(english)
    zh_headings, zh_blocks = structure(chinese)
    found = []
    en_levels = [level for level, _ in en_headings]
    zh_levels = [level for level, _ in zh_headings]
    if en_levels != zh_levels:
        n = next((k for k, pair in enumerate(zip(en_levels, zh_levels)) if pair[0] != pair[1]),
                 min(len(en_levels), len(zh_levels)))  # fmt: skip
        where = [h[n][1] if n < len(h) else "(end)" for h in (en_headings, zh_headings)]
        found.append(f"headings: English {len(en_levels)}, Chinese {len(zh_levels)}; heading "
                     f"{n + 1} is {where[0]!r} in English, {where[1]!r} in Chinese")  # fmt: skip
    if len(en_blocks) != len(zh_blocks):
        found.append(f"code blocks: English {len(en_blocks)}, Chinese {len(zh_blocks)}")
    for n, (en, zh) in enumerate(zip(en_blocks, zh_blocks), start=1):
        if en != zh:
            found.append(f"code block {n} differs: English {en[0]!r} {en[1][:60]!r}..., "
                         f"Chinese {zh[0]!r} {zh[1][:60]!r}...")  # fmt: skip
    return found


def read(relative: str) -> str:
    return (ROOT / relative).read_text("utf-8")


def top_links(relative: str) -> set[Path]:
    """The pages linked from a page's top: the first non-empty line under its title."""
    lines = read(relative).splitlines()
    assert lines[0].startswith("# "), f"{relative} does not start with its title"
    top = next(line for line in lines[1:] if line.strip())
    return {(ROOT / relative).parent.joinpath(target).resolve() for target in _LINK.findall(top)}


@pytest.mark.parametrize(("english", "chinese"), PAIRS.items())
def test_the_chinese_page_has_the_english_sections_and_code_blocks(
    english: str, chinese: str
) -> None:
    found = differences(read(english), read(chinese))
    assert not found, f"{chinese} is out of step with {english}:\n" + "\n".join(found)
    assert structure(read(english))[1], f"{english} has no code block to compare"


@pytest.mark.parametrize(("english", "chinese"), PAIRS.items())
def test_each_page_links_to_the_other_at_its_top(english: str, chinese: str) -> None:
    assert (ROOT / chinese).resolve() in top_links(english)
    assert (ROOT / english).resolve() in top_links(chinese)


def test_the_english_readme_names_the_chinese_docs() -> None:
    readme = read("README.md")
    for chinese in PAIRS.values():
        assert f"({chinese})" in readme, chinese


@pytest.mark.parametrize("english", PAIRS)
def test_a_section_or_code_block_missing_on_one_side_is_found(english: str) -> None:
    """The comparison has teeth: dropping the last code block, a heading, or one line inside a
    block, from either page, is reported."""
    text = read(english)
    _, block = structure(text)[1][-1]
    at = text.rindex(block)
    without_block = text[:at] + text[at + len(block) :]
    heading = re.search(r"^## .*\n", text, re.M)
    assert heading is not None
    without_heading = text.replace(heading.group(0), "", 1)
    edited = text[:at] + block.replace("\n", "\n\n", 1) + text[at + len(block) :]
    for broken in (without_block, without_heading, edited):
        assert differences(text, broken) != []
        assert differences(broken, text) != []
    assert differences(text, text) == []


def test_an_unclosed_code_block_is_an_error() -> None:
    with pytest.raises(AssertionError, match="unclosed code block at line 2"):
        structure("# title\n```python\nprint(1)\n")
