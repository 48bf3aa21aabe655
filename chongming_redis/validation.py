"""Argument checks shared by the model and every store, so every store refuses the same input
with the same message, before any I/O.

Rules (the store guide, §1 "Rules that apply to every method"):

* an identifier (task id, command id, name, tag, key, pipeline id, owner) is a non-empty ``str``
  of at most 1,024 UTF-8 bytes that encodes to UTF-8 (no lone surrogates); inside that, every
  character is allowed;
* an integer is an exact ``int`` (``bool`` refused) in ``0 <= n < 2**53``, so it is exact in a
  Lua double and a sorted-set score;
* a datetime is timezone-aware and between 1970-01-01 and 2255-06-05 UTC, the range that
  integer microseconds since the epoch hold exactly below 2**53.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

MAX_ID_BYTES = 1024
MAX_INT = 2**53 - 1
MAX_TEXT_BYTES = 64 * 1024
MAX_EPOCH_US = 2**53 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def check_identifier(value: object, what: str) -> str:
    """Return ``value`` if it is a usable identifier, else raise ``TypeError``/``ValueError``."""
    if type(value) is not str:
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if value.isascii():  # the common case: one byte per character, nothing to encode
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"{what} is not encodable as UTF-8 (lone surrogate?)") from None
    if size > MAX_ID_BYTES:
        raise ValueError(f"{what} is {size} UTF-8 bytes; at most {MAX_ID_BYTES} are allowed")
    return value


def check_optional_identifier(value: object, what: str) -> str | None:
    return None if value is None else check_identifier(value, what)


def check_text(value: object, what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """Free text (messages, tracebacks, reasons): any UTF-8 ``str`` up to ``max_bytes``."""
    if type(value) is not str:
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not encodable as UTF-8 (lone surrogate?)") from None
    if size > max_bytes:
        raise ValueError(f"{what} is {size} UTF-8 bytes; at most {max_bytes} are allowed")
    return value


def check_optional_text(value: object, what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> str | None:
    return None if value is None else check_text(value, what, max_bytes=max_bytes)


def check_int(value: object, what: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """An exact ``int`` (never ``bool``, ``float`` or ``str``) within ``[minimum, maximum]``."""
    if type(value) is not int:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum or value > maximum:
        raise ValueError(f"{what} must be between {minimum} and {maximum}, not {value}")
    return value


def check_priority(value: object) -> int:
    """A task priority: an ``int`` in -100..100 (``TaskSnapshot.priority``)."""
    return check_int(value, "priority", minimum=-100, maximum=100)


def check_number(value: object, what: str) -> int | float:
    """A finite ``int`` or ``float`` (never ``bool``), for progress counters."""
    if type(value) is int:
        if abs(value) > MAX_INT:
            raise ValueError(f"{what} must be within ±{MAX_INT}, not {value}")
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise ValueError(f"{what} must be finite, not {value}")
        return value
    raise TypeError(f"{what} must be an int or float, not {type(value).__name__}")


def check_dt(value: object, what: str) -> datetime:
    """An aware datetime in the storable range, returned converted to UTC."""
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is timezone.utc:
        utc = value
    elif value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware; naive datetimes have no instant")
    else:
        try:
            utc = value.astimezone(timezone.utc)
        except OverflowError:  # year 1 east of UTC, year 9999 west of it: not even a datetime
            utc = EPOCH - timedelta(microseconds=1)  # refused as out of range below
    if not EPOCH <= utc <= MAX_DT:
        raise ValueError(
            f"{what} {value.isoformat()} is outside the storable range 1970-01-01..2255-06-05 UTC"
        )
    return utc


def check_optional_dt(value: object, what: str) -> datetime | None:
    return None if value is None else check_dt(value, what)


def check_bool(value: object, what: str) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{what} must be a bool, not {type(value).__name__}")
    return value


def check_positive_seconds(value: object, what: str, *, maximum: float) -> float:
    """A finite positive duration in seconds (int or float, never bool) up to ``maximum``."""
    if type(value) not in (int, float):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)  # type: ignore[arg-type]
    if not math.isfinite(seconds) or seconds <= 0 or seconds > maximum:
        raise ValueError(f"{what} must be > 0 and <= {maximum}, not {value!r}")
    return seconds


MAX_DT = EPOCH + timedelta(microseconds=MAX_EPOCH_US)
