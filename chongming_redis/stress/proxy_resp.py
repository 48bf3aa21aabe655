"""RESP framing for the fault proxy: where one client request or one Redis reply ends.

Split out of :mod:`chongming_redis.stress.fault_proxy` (whose docstring explains why the proxy
parses both directions); pure functions over bytes, no I/O.
"""

from __future__ import annotations


class RespError(ValueError):
    """The byte stream is not RESP this proxy understands."""


def parse_request(buf: bytes | bytearray, pos: int = 0) -> tuple[int, bytes | None] | None:
    """Parse one client request starting at ``pos``.

    Returns ``(end, name)`` where ``name`` is the upper-cased command name, or ``None`` as the
    name for input Redis treats as "no command, no reply" (``*0``, an empty inline line).
    Returns ``None`` when the request is not complete yet. Raises :class:`RespError` on input
    Redis would reject with a protocol error.
    """
    size = len(buf)
    if pos >= size:
        return None
    if buf[pos] != ord("*"):
        # Inline command: one line, '\n' terminated ('\r' optional), whitespace separated.
        nl = buf.find(b"\n", pos)
        if nl < 0:
            return None
        words = bytes(buf[pos:nl]).split()
        return nl + 1, (words[0].upper() if words else None)
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return None
    try:
        count = int(buf[pos + 1 : nl])
    except ValueError as exc:
        raise RespError(f"bad multibulk length {bytes(buf[pos:nl])!r}") from exc
    pos = nl + 2
    name: bytes | None = None
    for index in range(max(count, 0)):
        if pos >= size:
            return None
        if buf[pos] != ord("$"):
            raise RespError(f"expected '$' in request, got {bytes(buf[pos : pos + 1])!r}")
        nl = buf.find(b"\r\n", pos)
        if nl < 0:
            return None
        try:
            length = int(buf[pos + 1 : nl])
        except ValueError as exc:
            raise RespError(f"bad bulk length {bytes(buf[pos:nl])!r}") from exc
        if length < 0:
            raise RespError("negative bulk length in request")
        start = nl + 2
        end = start + length + 2
        if end > size:
            return None
        if index == 0:
            name = bytes(buf[start : start + length]).upper()
        pos = end
    return pos, name


_SIMPLE = frozenset(b"+-:_,#(")
_BLOB = frozenset(b"$!=")
_AGGREGATE = frozenset(b"*~>")
_MAP = frozenset(b"%|")


def reply_end(buf: bytes | bytearray, pos: int = 0) -> int | None:
    """End offset of the complete RESP2/RESP3 reply starting at ``pos``, or ``None`` if partial.

    Iterative (counts the values still owed), so deep or wide replies cost no recursion.
    An attribute (``|``) is followed by the value it annotates, which belongs to the same reply.
    """
    size = len(buf)
    owed = 1
    while owed:
        if pos >= size:
            return None
        kind = buf[pos]
        nl = buf.find(b"\r\n", pos)
        if nl < 0:
            return None
        header = buf[pos + 1 : nl]
        pos = nl + 2
        owed -= 1
        if kind in _SIMPLE:
            continue
        try:
            count = int(header)
        except ValueError as exc:
            raise RespError(f"bad length {bytes(header)!r} for type {chr(kind)!r}") from exc
        if kind in _BLOB:
            if count >= 0:
                pos += count + 2
                if pos > size:
                    return None
        elif kind in _AGGREGATE:
            owed += max(count, 0)
        elif kind in _MAP:
            owed += 2 * max(count, 0) + (1 if kind == ord("|") else 0)
        else:
            raise RespError(f"unknown RESP type byte {chr(kind)!r}")
    return pos
