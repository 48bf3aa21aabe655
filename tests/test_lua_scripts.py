"""The Lua side: the include mechanism, the script headers, and the one-round-trip rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chongming_redis.errors import (
    CommandNotFound,
    ConcurrencyConflict,
    CorruptRecord,
    StoreError,
    TaskAlreadyExists,
)
from chongming_redis.stores._redis import replies
from chongming_redis.stores._redis.replies import REPLIES
from chongming_redis.stores._redis.scripts import (
    READ_ONLY_SCRIPTS,
    SCRIPT_NAMES,
    ScriptLoadError,
    expand,
    script_text,
)
from chongming_redis.stores.protocol import PROTOCOL_METHODS

LUA = Path(__file__).resolve().parents[1] / "lua"


def fake_sources(files: dict[str, str]):  # type: ignore[no-untyped-def]
    def read(name: str) -> str:
        if name not in files:
            raise ScriptLoadError(f"Lua script {name!r} not found")
        return files[name]

    return read


# -- the include mechanism -------------------------------------------------------------------


def test_an_include_is_replaced_by_the_library_text() -> None:
    read = fake_sources(
        {"op": '--- @include "lib/a"\nreturn a()', "lib/a": "local function a() end"}
    )
    assert expand("op", read) == "local function a() end\nreturn a()\n"


def test_a_library_named_twice_is_included_once() -> None:
    read = fake_sources(
        {
            "op": '--- @include "lib/a"\n--- @include "lib/b"\n--- @include "lib/a"\nx',
            "lib/a": "A",
            "lib/b": '--- @include "lib/a"\nB',
        }
    )
    assert expand("op", read).split() == ["A", "B", "x"]


def test_an_include_cycle_is_refused() -> None:
    read = fake_sources({"op": '--- @include "lib/a"', "lib/a": '--- @include "lib/b"',
                         "lib/b": '--- @include "lib/a"'})  # fmt: skip
    with pytest.raises(ScriptLoadError, match="cycle"):
        expand("op", read)


def test_a_self_include_is_refused() -> None:
    with pytest.raises(ScriptLoadError, match="cycle"):
        expand("op", fake_sources({"op": '--- @include "op"'}))


def test_a_missing_library_is_a_clear_error() -> None:
    with pytest.raises(ScriptLoadError, match="lib/nope"):
        expand("op", fake_sources({"op": '--- @include "lib/nope"'}))


def test_the_shebang_stays_the_first_line_and_legacy_mode_drops_it() -> None:
    text = script_text("query")
    assert text.startswith("#!lua flags=no-writes\n")
    assert "#!" not in script_text("query", legacy=True)
    assert script_text("save").startswith("#!lua\n")


def test_every_shipped_script_expands_without_leftover_includes() -> None:
    for name in SCRIPT_NAMES:
        assert "@include" not in script_text(name), name


def test_scripts_are_expanded_once_and_cached() -> None:
    assert script_text("append") is script_text("append")


# -- one script per operation, with an honest header ----------------------------------------


def test_every_writing_protocol_method_has_its_own_script_file() -> None:
    plain_reads = {"get", "counts", "history", "close"}
    runtime_scripts = {"pool_tick", "start_tasks", "commit_tasks", "commit_start", "changes",
                       "upgrade_start_order",
                       "expire_finished", "write_schedule", "delete_schedule",
                       "release_dependents"}  # fmt: skip
    dashboard_reads = {"task_commands"}  # CommandInspectingStore: ids, then their hashes
    expected = {m for m in PROTOCOL_METHODS if m not in plain_reads} | runtime_scripts
    expected |= dashboard_reads
    assert {p.stem for p in LUA.glob("*.lua")} == expected == set(SCRIPT_NAMES)


def test_read_only_scripts_declare_no_writes_and_call_no_write_command() -> None:
    for name in READ_ONLY_SCRIPTS:
        text = script_text(name)
        assert text.startswith("#!lua flags=no-writes")
        calls = re.findall(r"rcall\('([A-Z]+)'", text)
        assert calls and set(calls) <= {
            "TYPE", "HMGET", "HGETALL", "HKEYS", "ZRANGEBYSCORE", "ZREVRANGEBYSCORE",
            "ZRANGEBYLEX", "ZRANGE", "ZREVRANGE", "ZRANK", "ZREVRANK", "ZCARD", "ZCOUNT",
            "EXISTS", "LRANGE", "HGET",
        }, name  # fmt: skip


def header(name: str) -> str:
    text = (LUA / f"{name}.lua").read_text()
    match = re.search(r"--\[\[(.*?)\]\]", text, re.S)
    assert match, f"{name}.lua has no --[[ header ]]"
    return match.group(1)


def code_of(text: str) -> str:
    """Lua source without its comments (the header is cut off before)."""
    return re.sub(r"--.*", "", text)


def without_strings(code: str) -> str:
    """Lua code with every string literal emptied: 'KEYS[1] is not ...' is not a read."""
    return re.sub(r"'[^'\n]*'", "''", code)


def body(name: str) -> str:
    """A script's code; a body kept in a library (``lib/X_body``, run at ARGV offset ``A``) is
    inlined where the script runs it at offset 1 (start_tasks, commit_tasks), with its reads
    as absolute indices, so the header checks see what the script reads. commit_start runs
    them at other offsets: its own header documents its own ARGV."""
    code = code_of((LUA / f"{name}.lua").read_text().split("]]", 1)[1])
    for lib in re.findall(r"\b(\w+_body)\(KEYS\[1\], (?:KEYS\[2\], )?1,", code):
        inlined = code_of((LUA / "lib" / f"{lib}.lua").read_text())
        inlined = re.sub(r"\bARGV\[A\]", "ARGV[1]", inlined)
        inlined = re.sub(r"\b(ARGV\[|read_\w+\()A \+ (\d+)", lambda m: f"{m[1]}{int(m[2]) + 1}",
                         inlined)  # fmt: skip
        code += inlined
    return code


def section(text: str, title: str) -> str:
    """A header section: from its title line to the next blank line."""
    match = re.search(rf"^{title}\n(.*?)(?:\n\s*\n|\Z)", text, re.M | re.S)
    assert match, f"no {title} section"
    return match.group(1)


def lib_codes() -> dict[str, set[str]]:
    """For every function of lua/lib, the reply codes it may hand back (transitively)."""
    functions: dict[str, str] = {}
    for path in (LUA / "lib").glob("*.lua"):
        code = code_of(path.read_text())
        for match in re.finditer(r"^local function (\w+)\(.*?(?=^local function |\Z)", code,
                                 re.M | re.S):  # fmt: skip
            functions[match.group(1)] = match.group(0)
    codes = {name: set(re.findall(r"\{ '([A-Z]+)'", text)) for name, text in functions.items()}
    changed = True
    while changed:
        changed = False
        for name, text in functions.items():
            for callee, more in codes.items():
                if re.search(rf"\b{callee}\(", text) and not more <= codes[name]:
                    codes[name] |= more
                    changed = True
    return codes


LIB_CODES = lib_codes()


def returned(name: str) -> dict[str, set[str]]:
    """The codes a script's body may return: first elements (its own tables and those of the
    library functions it calls, such as corrupt() and badarg()), second codes of 'OK' replies,
    and commit_tasks's per-item codes (quoted codes on lines that set or test `code`)."""
    code = body(name)
    first = set(re.findall(r"\{ '([A-Z]+)'", code))
    for function, codes in LIB_CODES.items():
        if re.search(rf"\b{function}\(", code):
            first |= codes
    items = {
        c
        for line in code.splitlines()
        if re.search(r"\bcode\b", line)
        for c in re.findall(r"(?<!rcall\()'([A-Z]+)'", line)
    }
    return {
        "codes": first,
        "details": set(re.findall(r"\{ 'OK', '([A-Z]+)'", code)),
        "items": items,
    }


def documented(name: str) -> dict[str, set[str]]:
    """The codes the header's Replies section names, in the same three places; per-item codes
    are lines `item 'CODE'  meaning`."""
    text = section(header(name), "Replies")
    return {
        "codes": set(re.findall(r"\{'([A-Z]+)'", text)),
        "details": set(re.findall(r"\{'OK', '([A-Z]+)'", text)),
        "items": set(re.findall(r"^\s*item '([A-Z]+)'", text, re.M)),
    }


def tabled(name: str) -> dict[str, set[str]]:
    replies = REPLIES[name]
    return {"codes": set(replies.codes), "details": set(replies.details),
            "items": set(replies.items)}  # fmt: skip


def test_the_library_helpers_are_seen_to_return_their_codes() -> None:
    assert LIB_CODES["corrupt"] == {"CORRUPT"} and LIB_CODES["badarg"] == {"BADARG"}
    assert LIB_CODES["read_index_view"] == {"CORRUPT"}
    assert LIB_CODES["read_task_args"] == {"BADARG"}
    assert LIB_CODES["is_uint"] == set()


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_header_documents_keys_replies_and_the_bound(name: str) -> None:
    text = header(name)
    assert re.search(r"^KEYS\[1\]", text, re.M), "KEYS documented"
    assert "Bound:" in text
    # Every KEYS[n] the body reads is documented, and every documented one is read.
    code = without_strings(body(name))
    used = set(re.findall(r"\bKEYS\[(\d+)\]", code))
    documented_keys = set(re.findall(r"^KEYS\[(\d+)\]", text, re.M))
    assert used == documented_keys, (used, documented_keys)
    lines = text.splitlines()
    keys_at = [i for i, line in enumerate(lines) if line.startswith("KEYS[")]
    argv_at = [i for i, line in enumerate(lines) if line.startswith("ARGV")]
    assert argv_at and max(keys_at) < min(argv_at), "the KEYS lines, then the ARGV lines"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_header_documents_every_argv_index_the_body_reads(name: str) -> None:
    """Every fixed ARGV[n] the body reads is a header line `ARGV[n]`; every such line is read,
    directly or as the start of a counted list / pairs (read_list(n), read_pairs(n)); the
    indices run 1..k without a gap. A layout described elsewhere ("lib/task_args layout")
    stands for the arguments read_task_args parses, and is named exactly where it is used."""
    text, code = header(name), without_strings(body(name))
    indices = {int(n) for n in re.findall(r"^ARGV\[(\d+)(?:\.\.)?\]", text, re.M)}
    read = {int(n) for n in re.findall(r"\bARGV\[(\d+)\]", code)}
    read_from = {int(n) for n in re.findall(r"\bread_\w+\((\d+)\)", code)}
    assert read <= indices, f"ARGV read but not documented: {sorted(read - indices)}"
    assert indices <= read | read_from, f"documented, never read: {sorted(indices - read)}"
    assert indices == set(range(1, len(indices) + 1)), sorted(indices)
    layout = "lib/task_args layout" in text
    assert layout == ("read_task_args(" in code)
    assert indices or layout, "an ARGV section"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_reply_code_is_documented_and_in_the_python_table(name: str) -> None:
    """The codes the body returns, the header's Replies section and ``_redis.replies.REPLIES`` name
    the same codes, in the same places (first element, 'OK' detail, per item)."""
    body_codes, header_codes, table_codes = returned(name), documented(name), tabled(name)
    assert body_codes["codes"], "the body returns a code"
    for where in ("codes", "details", "items"):
        assert body_codes[where] <= header_codes[where], (where, "returned, not documented")
        assert header_codes[where] == table_codes[where], (where, "header vs REPLIES")
        assert table_codes[where] <= body_codes[where], (where, "in REPLIES, never returned")


def test_the_table_covers_exactly_the_shipped_scripts() -> None:
    assert set(REPLIES) == set(SCRIPT_NAMES)


# -- the table's exceptions --------------------------------------------------------------------


def test_failure_codes_become_the_exceptions_naming_the_call() -> None:
    call = replies.Call("save", task_id="a", expected=3)
    assert replies.check(call, [b"OK", b"APPLIED"]) == ["OK", b"APPLIED"]
    with pytest.raises(ConcurrencyConflict) as conflict:
        replies.check(call, [b"CONFLICT", b"5"])
    assert (conflict.value.task_id, conflict.value.expected, conflict.value.actual) == ("a", 3, 5)
    with pytest.raises(ConcurrencyConflict) as missing:
        replies.check(call, [b"CONFLICT", b""])
    assert missing.value.actual is None
    with pytest.raises(CorruptRecord) as corrupt:
        replies.check(call, [b"CORRUPT", b"k", b"", b"bad"])
    assert (corrupt.value.key, corrupt.value.field) == ("k", None)
    with pytest.raises(StoreError, match="script 'save' refused its arguments: nope"):
        replies.check(call, [b"BADARG", b"nope"])
    with pytest.raises(StoreError, match="unknown code 'EXISTS'"):
        replies.check(call, [b"EXISTS"])  # create's code, not save's
    with pytest.raises(CommandNotFound):
        replies.check(replies.Call("release_command", command_id="c"), [b"NOTFOUND"])
    with pytest.raises(StoreError, match="num_buckets=8, this worker has 4"):
        replies.check(replies.Call("pool_tick", namespace="n", num_buckets=4), ["MISMATCH", b"8"])


def test_commit_items_and_touch_details_are_read_from_the_table() -> None:
    item = replies.Call("commit_tasks", task_id="a", expected=1)
    assert replies.item_error(item, b"OK", b"") is None
    assert replies.item_error(item, b"APPLIED", b"") is None
    assert isinstance(replies.item_error(item, b"EXISTS", b""), TaskAlreadyExists)
    conflict = replies.item_error(item, b"CONFLICT", b"4")
    assert isinstance(conflict, ConcurrencyConflict) and conflict.actual == 4
    touch = replies.Call("touch")
    assert replies.applied(touch, ["OK"])
    assert not replies.applied(touch, ["OK", b"MISSING"])
    assert not replies.applied(touch, ["OK", b"FENCED", b"3"])
