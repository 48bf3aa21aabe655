"""A TCP proxy that delays every chunk by a fixed time each way, order kept: a network's round
trip between the workers and a loopback Redis (``bench.throughput --rtt-ms``).

    python -m bench.delay_proxy LISTEN_PORT TARGET_PORT DELAY_SECONDS

It adds CPU of its own (one asyncio process): compare runs through it with each other, not with
the loopback drains."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from types import TracebackType


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(65536):
            loop.call_later(delay, writer.write, data)
    finally:
        loop.call_later(delay + 0.001, writer.close)


async def _serve(listen: int, target: int, delay: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(_pump(reader, upstream_writer, delay),
                             _pump(upstream_reader, writer, delay),
                             return_exceptions=True)  # fmt: skip

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


class DelayProxy:
    """The proxy in a child process, in front of ``127.0.0.1:target``; ``url`` reaches Redis
    through it."""

    def __init__(self, target: int, rtt_seconds: float) -> None:
        self.target, self.delay = target, rtt_seconds / 2
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"redis://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DelayProxy:
        command = [sys.executable, "-m", "bench.delay_proxy", str(self.port), str(self.target),
                   str(self.delay)]  # fmt: skip
        self._proc = subprocess.Popen(command)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # listening?
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the delay proxy did not start")

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
