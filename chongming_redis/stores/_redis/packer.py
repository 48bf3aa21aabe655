"""The command packer of every synchronous connection the stores open: hiredis's, handed
bytes and str only.

Why: ``hiredis.pack_command`` (hiredis 3.5 and earlier) turns an ``int`` or ``float`` argument
into text with ``PyObject_Repr``, which runs pending Python signal handlers first; when one
raises (``KeyboardInterrupt`` at Ctrl-C, any handler that raises) ``PyObject_Repr`` returns
NULL and hiredis reads it: the process dies of a segmentation fault instead of raising.
``chongming-redis changes --follow`` died so at SIGINT, and so could any program using a
store. Turning numbers into bytes here, in Python, first lets a handler's exception surface
between bytecodes as it should; hiredis then only copies bytes. (redis-py's asyncio client
packs in Python and is not affected.)
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.connection import Connection
from redis.exceptions import DataError


class SignalSafePacker:
    """redis-py's ``HiredisRespSerializer`` with numbers encoded before hiredis sees them
    (in one pass: it packs faster than redis-py's own, which copies the arguments twice)."""

    def pack(self, *args: Any) -> list[bytes]:
        head = args[0]  # a multi-word command name ("CLIENT SETNAME") is split, as redis-py does
        if isinstance(head, str):
            args = tuple(head.encode().split()) + args[1:]
        elif b" " in head:
            args = tuple(head.split()) + args[1:]
        encoded = []
        for arg in args:
            kind = type(arg)
            if kind is int:  # exact int, as hiredis takes it (a bool stays refused)
                arg = b"%d" % arg
            elif kind is float:
                arg = repr(arg).encode()
            elif kind is bytearray or kind is memoryview:
                arg = bytes(arg)
            encoded.append(arg)
        try:
            return [hiredis.pack_command(tuple(encoded))]
        except TypeError as exc:
            raise DataError(exc) from None


PACKER = SignalSafePacker()
"""Stateless: one instance serves every connection."""


class SignalSafeConnection(Connection):
    """A TCP connection with ``SignalSafePacker``: for clients that take a connection class
    but not a packer (redis-py's cluster client filters its node options; over TLS it picks
    its own class, so a ``rediss://`` cluster keeps redis-py's packer)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(command_packer=PACKER, **kwargs)  # type: ignore[no-untyped-call]
