"""The Lua side: the include mechanism, the script headers, and the one-round-trip rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chongming_redis.stores._scripts import (
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
    runtime_scripts = {"pool_tick", "start_tasks", "commit_tasks", "changes"}
    expected = {m for m in PROTOCOL_METHODS if m not in plain_reads} | runtime_scripts
    assert {p.stem for p in LUA.glob("*.lua")} == expected == set(SCRIPT_NAMES)


def test_read_only_scripts_declare_no_writes_and_call_no_write_command() -> None:
    for name in READ_ONLY_SCRIPTS:
        text = script_text(name)
        assert text.startswith("#!lua flags=no-writes")
        calls = re.findall(r"rcall\('([A-Z]+)'", text)
        assert calls and set(calls) <= {
            "TYPE", "HMGET", "HGETALL", "HKEYS", "ZRANGEBYSCORE", "ZREVRANGEBYSCORE",
            "ZRANGEBYLEX", "ZRANGE", "ZCARD", "ZCOUNT", "EXISTS", "LRANGE", "HGET",
        }, name  # fmt: skip


def header(name: str) -> str:
    text = (LUA / f"{name}.lua").read_text()
    match = re.search(r"--\[\[(.*?)\]\]", text, re.S)
    assert match, f"{name}.lua has no --[[ header ]]"
    return match.group(1)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_header_documents_keys_replies_and_the_bound(name: str) -> None:
    text = header(name)
    assert re.search(r"^KEYS\[1\]", text, re.M), "KEYS documented"
    assert "Replies" in text
    assert "Bound:" in text
    # Every KEYS[n] the body reads is documented, and every documented one is read.
    body = (LUA / f"{name}.lua").read_text().split("]]", 1)[1]
    used = set(re.findall(r"KEYS\[(\d)\]", body))
    documented = set(re.findall(r"^KEYS\[(\d)\]", text, re.M))
    assert used == documented, (used, documented)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_documented_reply_code_is_one_the_python_side_knows(name: str) -> None:
    known = {"OK", "EXISTS", "CONFLICT", "NOTFOUND", "CORRUPT", "BADARG", "MISMATCH", "AHEAD"}
    body = (LUA / f"{name}.lua").read_text()
    returned = set(re.findall(r"return \{ '([A-Z]+)'", body))
    assert returned <= known, returned - known
