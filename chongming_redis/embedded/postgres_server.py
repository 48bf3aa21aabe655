"""A private PostgreSQL server for tests and benchmarks: Debian's ``initdb`` and ``postgres``
binaries (``/usr/lib/postgresql/<major>/bin``, the ``postgresql`` package) run on a fresh data
directory in a temporary directory, on a free loopback port, with the unix socket in that
directory.

* ``initdb`` refuses to run as root, and so does ``postgres``: as root (CI, this machine) both run
  as the unprivileged ``postgres`` user the package creates (``subprocess``'s ``user=``), and the
  temporary directory is handed to that user; as anyone else they run as the caller.
* Authentication is ``trust`` on loopback and the socket only: the server is private to the test
  run and listens on 127.0.0.1 alone. The superuser is ``chongming``.
* ``fsync=off`` (and no full-page writes), for speed. That loses nothing a test can observe: a
  commit is still written to the kernel before it is acknowledged (``synchronous_commit`` stays
  on), so a SIGKILL of every server process keeps every acknowledged commit; only a crash of the
  whole machine could lose one, and no test crashes the machine.
* ``test_settings=False`` (the benchmarks): none of the test settings below, so the server runs
  with what ``initdb`` wrote, the defaults a user gets (``fsync`` on, ``shared_buffers``
  128MB, ``max_connections`` 100), plus only the ``settings`` given.
* ``kill9()`` SIGKILLs the postmaster and every backend at once (they share a process group)
  and waits until all are gone; ``restart()`` starts a server again on the same data directory
  and port, which then recovers from its write-ahead log.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from chongming_redis.embedded.redis_server import free_port
from chongming_redis.errors import extra_imports

__all__ = ["PostgresProc", "postgres_bin_dir"]

SUPERUSER = "chongming"
LOOPBACK = "127.0.0.1"


def postgres_bin_dir() -> Path | None:
    """The newest Debian PostgreSQL's binaries, or ``None`` when the package is missing."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major, reverse=True)
    return Path(found[0]).parent if found else None


def _major(initdb: str) -> int:
    version = Path(initdb).parent.parent.name
    return int(version) if version.isdigit() else 0


class PostgresProc:
    """One private PostgreSQL server, already running; ``dsn`` connects to it."""

    def __init__(
        self, *, settings: dict[str, str] | None = None, test_settings: bool = True
    ) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install -y postgresql)")
        self.bin_dir = bin_dir
        self.port = free_port()
        self.settings = {**(_TEST_SETTINGS if test_settings else {}), **(settings or {})}
        self._user = _server_user()
        # /tmp rather than $TMPDIR: the postgres user must reach it (a TMPDIR under /root is
        # closed to it), and the socket's path must stay under the 107-byte limit.
        base = "/tmp" if os.path.isdir("/tmp") else None
        self.dir = Path(tempfile.mkdtemp(prefix="chongming-pg-test-", dir=base))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        if self._user is not None:
            os.chown(self.dir, self._user.pw_uid, self._user.pw_gid)
        try:
            self._initdb()
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def dsn(self) -> str:
        """The ``postgres`` database as the superuser, over TCP on loopback."""
        return f"postgresql://{SUPERUSER}@{LOOPBACK}:{self.port}/postgres"

    def start(self, timeout: float = 30.0) -> None:
        """Start the server on the data directory and wait until it accepts connections."""
        options = [f"--{name}={value}" for name, value in self.settings.items()]
        args = [
            str(self.bin_dir / "postgres"),
            "-D", str(self.data),
            "-p", str(self.port),
            "-k", str(self.dir),
            "-c", f"listen_addresses={LOOPBACK}",
            *options,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            # Its own session: the postmaster's backends share its process group, so kill9
            # reaches all of them with one signal.
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._as_server_user(),
            )
        self._wait_ready(timeout)

    def kill9(self) -> None:
        """SIGKILL the postmaster and every backend at once, and wait until all are gone."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._wait_group_gone(self.proc.pid)
        self.proc = None

    def restart(self, timeout: float = 30.0) -> None:
        """Start again on the same data directory and port (after ``kill9`` or ``stop``)."""
        self.start(timeout)

    def stop(self) -> None:
        """A fast shutdown (SIGINT: roll back open transactions, write a checkpoint)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._wait_group_gone(self.proc.pid)
        self.proc = None

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- internals -------------------------------------------------------------------------

    def _initdb(self) -> None:
        args = [
            str(self.bin_dir / "initdb"),
            "-D", str(self.data),
            "-U", SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",  # initdb's own files only (tests run with fsync off anyway)
        ]  # fmt: skip
        done = subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            check=False,
            **self._as_server_user(),
        )
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{output}")

    def _as_server_user(self) -> dict[str, Any]:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def _wait_ready(self, timeout: float) -> None:
        with extra_imports("postgres", "PostgresProc (it connects with psycopg)"):
            import psycopg  # imported here, once a server runs

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"postgres did not accept connections within {timeout} s:\n"
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    @staticmethod
    def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
        """Backends outlive a killed postmaster for a moment; a new postmaster refuses to start
        while they still hold the old shared memory."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)
        raise RuntimeError(f"PostgreSQL processes of group {pgid} outlived SIGKILL")


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as: ``postgres`` when we are root (both binaries refuse root),
    else ``None`` (the caller itself)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "running as root, and there is no 'postgres' user to run PostgreSQL as "
            "(the postgresql package creates it)"
        ) from None


#: Server settings for tests (see the module docstring for fsync).
_TEST_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "300",  # every test's pools and the 8-process races at once
    "shared_buffers": "32MB",
    "unix_socket_permissions": "0777",  # the tests (root) may use the socket too
}
