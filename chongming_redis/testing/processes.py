"""A child process driven over JSON lines: commands to its stdin, one JSON object per line
from its stdout, its stderr in a file (for the message when it goes quiet). Used by the
cross-process tests and the benchmarks that release worker processes together."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    name: str
    stderr_path: Path
    buffer: bytes = b""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def read_json(self, timeout: float = 15.0) -> dict[str, Any]:
        """The next stdout line as JSON, waiting at most ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no line within {timeout}s; {self.stderr()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"{self.name} closed stdout; {self.stderr()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def stderr(self) -> str:
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return f"stderr of {self.name}:\n{text[-3000:]}"
