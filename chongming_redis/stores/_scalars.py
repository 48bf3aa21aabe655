"""The scalar encodings of the codec (``stores/codec.py``, which exports them): datetimes as
integer microseconds since the epoch (UTC), tags as a sorted JSON array, payloads as msgpack
(at most ``MAX_PAYLOAD_BYTES``), integers as canonical decimal text when a backend hands back
text."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

import msgpack

from chongming_redis.validation import EPOCH, MAX_EPOCH_US, check_dt, check_identifier

MAX_PAYLOAD_BYTES = 1024 * 1024
CANONICAL_INT = re.compile(r"^(0|-?[1-9][0-9]*)$")


def int_value(value: object) -> int:
    if type(value) is int:
        return value
    # Fast path for what stores hand back: non-negative canonical decimal text.
    if type(value) is bytes and value.isdigit() and (value[0] != 48 or len(value) == 1):
        return int(value)
    if isinstance(value, bytes | str):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if CANONICAL_INT.fullmatch(text):
            return int(text)
        raise ValueError(f"{text[:40]!r} is not a canonical integer")
    raise ValueError(f"expected an integer, got {type(value).__name__}")


def encode_dt(value: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch, UTC."""
    return micros(check_dt(value, "datetime"))


def micros(utc: datetime) -> int:
    """``encode_dt`` without the checks, for a datetime a record already validated."""
    delta = utc - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def decode_dt(value: int | str | bytes) -> datetime:
    """The inverse of ``encode_dt``; accepts the integer or its canonical decimal text."""
    micros = int_value(value)
    if micros < 0 or micros > MAX_EPOCH_US:
        raise ValueError(f"timestamp {micros} is outside the storable range")
    return EPOCH + timedelta(microseconds=micros)


def encode_tags(tags: frozenset[str]) -> str:
    """Tags as a JSON array, sorted, so equal sets encode equally."""
    for tag in tags:
        check_identifier(tag, "tag")
    return tags_json(tags)


def tags_json(tags: frozenset[str]) -> str:
    return json.dumps(sorted(tags), ensure_ascii=False, separators=(",", ":"))


def decode_tags(value: str | bytes) -> frozenset[str]:
    text = value.decode("utf-8") if isinstance(value, bytes) else value
    items = json.loads(text)
    if not isinstance(items, list) or not all(isinstance(t, str) and t for t in items):
        raise ValueError("tags must be a JSON array of non-empty strings")
    return frozenset(items)


def encode_payload(value: Any, what: str = "payload") -> bytes | None:
    """``params``/``result``/``payload`` as msgpack; ``None`` stays ``None``."""
    if value is None:
        return None
    try:
        data = msgpack.packb(value, use_bin_type=True, datetime=False)
    except TypeError as exc:
        raise TypeError(f"{what} is not serialisable (msgpack): {exc}") from None
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"{what} is not serialisable (msgpack): {exc}") from None
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"{what} is {len(data)} bytes encoded; at most {MAX_PAYLOAD_BYTES} are allowed"
        )
    return bytes(data)


def decode_payload(value: bytes | str) -> Any:
    if not isinstance(value, bytes):
        raise ValueError("payload must be bytes")
    return msgpack.unpackb(value, raw=False, strict_map_key=False)
