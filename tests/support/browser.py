"""Real-browser helpers for the dashboard's tests: headless Chromium through selenium, using the
browser and the driver installed on the machine (Debian's ``chromium`` and ``chromium-driver``),
never one that selenium-manager would download; the dashboard (``chongming-redis dashboard``)
and a worker of the demo app as real processes; and checks of the screenshots taken.

Like ``redis-server``: a missing browser or driver skips the tests locally and fails them in CI
(``CI`` set), so the browser proofs never silently disappear from a green run.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
IN_CI = bool(os.environ.get("CI"))
WINDOW = (1400, 1000)
#: Generous bound on any wait for the page (the worker or the event stream being slow).
WAIT = 30.0
T = TypeVar("T")


# -- the browser ---------------------------------------------------------------------------------


def browser_paths() -> tuple[str, str] | None:
    """``(chromium, chromedriver)`` from PATH, or ``None`` if either is missing."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        return None
    return binary, driver


def require_browser() -> tuple[str, str]:
    paths = browser_paths()
    if paths is None:
        message = "chromium or chromedriver is not on PATH (apt-get install -y chromium " \
                  "chromium-driver)"  # fmt: skip
        if IN_CI or updating_screenshots():
            pytest.fail(message)
        pytest.skip(message)
    return paths


def updating_screenshots() -> bool:
    """``CHONGMING_UPDATE_SCREENSHOTS=1`` (``make screenshots``): copy them into the docs."""
    return os.environ.get("CHONGMING_UPDATE_SCREENSHOTS") == "1"


def start_chrome() -> webdriver.Chrome:
    """Headless Chromium of the machine. The driver's path is given, so selenium never runs
    selenium-manager (which would download a browser or a driver)."""
    binary, driver = require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}", "--disable-gpu",
                     "--no-first-run", "--disable-extensions", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(argument)
    service = Service(executable_path=driver)
    chrome = webdriver.Chrome(options=options, service=service)
    chrome.set_page_load_timeout(WAIT)
    chrome.set_script_timeout(WAIT)
    return chrome


def wait_for(driver: webdriver.Chrome, condition: Callable[[Any], T], what: str,
             timeout: float = WAIT) -> T:  # fmt: skip
    """``condition(driver)`` once it is truthy; a failure names ``what`` was awaited."""
    result: T = WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        condition, f"waited {timeout:g} s for {what}"
    )
    return result


def js(driver: webdriver.Chrome, script: str, *args: Any) -> Any:
    return driver.execute_script(script, *args)


def fetch(driver: webdriver.Chrome, url: str, method: str = "GET",
          form: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """``fetch`` from the page (same origin, with its cookies): ``{"status", "body"}``, the body
    parsed as JSON when it is JSON, else as text."""
    script = """
        const [url, method, form, done] = arguments;
        const init = {method: method, credentials: "same-origin"};
        if (form !== null) init.body = new URLSearchParams(form);
        fetch(url, init).then(async (r) => {
            const text = await r.text();
            let body = text;
            try { body = JSON.parse(text); } catch (e) {}
            done({status: r.status, body: body, type: r.headers.get("content-type")});
        }).catch((e) => done({status: -1, body: String(e)}));
    """
    result: dict[str, Any] = driver.execute_async_script(script, url, method, form)
    return result


# -- screenshots ---------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    """Check ``data`` is a whole, decodable PNG (signature, chunk CRCs, IHDR, IDAT inflating to
    exactly the rows IHDR announces, IEND); its ``(width, height)``."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, chunks, idat = 8, [], b""
    header: tuple[int, ...] = ()
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind!r}"
        chunks.append(kind)
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks, chunks
    width, height, depth, colour, _, _, interlace = header
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    assert depth == 8 and interlace == 0, (depth, interlace)
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + width * channels), "the image data is not whole"
    return width, height


@dataclass
class Screenshots:
    """Saves screenshots to ``directory`` (always) and, with ``CHONGMING_UPDATE_SCREENSHOTS=1``,
    copies them to ``docs/screenshots/`` as well."""

    directory: Path
    docs: Path = ROOT / "docs" / "screenshots"

    def take(self, driver: webdriver.Chrome, name: str) -> Path:
        path = self.directory / f"{name}.png"
        data = driver.get_screenshot_as_png()
        width, height = png_size(data)
        # The viewport of the window asked for (less what the browser keeps), and an image
        # with content: a blank page compresses to a few kB.
        assert WINDOW[0] * 0.8 <= width <= WINDOW[0] * 2, (name, width)
        assert WINDOW[1] * 0.5 <= height <= WINDOW[1] * 2, (name, height)
        assert len(data) > 20_000, (name, len(data))
        path.write_bytes(data)
        if updating_screenshots():
            self.docs.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.docs / f"{name}.png")
        return path


# -- the processes -------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment of a child, without the ``CHONGMING_`` settings of the caller's."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}


def stop_process(process: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


LOGIN_LINE = re.compile(r"^control on: sign in at (http://\S+/login\?token=\S+)$")


def _read_lines(process: subprocess.Popen[bytes], count: int, timeout: float) -> list[str]:
    """The first ``count`` lines the process prints (its stdout read unbuffered: a buffered
    reader could hold the second line while ``select`` waits for more)."""
    assert process.stdout is not None
    fd, data = process.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while data.count(b"\n") < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"the dashboard printed no URL in time: {data!r}")
        ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the dashboard exited ({process.wait()}): {data!r}")
            data += chunk
    return data.decode().splitlines()[:count]


@dataclass
class Dashboard:
    """``chongming-redis dashboard`` as a process; ``url`` ends with ``/``."""

    process: subprocess.Popen[bytes]
    url: str
    login: str | None  # the sign-in link printed with --allow-control
    log: Path

    @classmethod
    def start(cls, redis_url: str, namespace: str, log: Path, *,
              token: str | None = None) -> Dashboard:  # fmt: skip
        argv = [sys.executable, "-m", "chongming_redis.cli", "dashboard", "--redis", redis_url,
                "--namespace", namespace, "--port", "0"]  # fmt: skip
        if token is not None:
            argv += ["--allow-control", "--token", token]
        with log.open("w") as err:
            process = subprocess.Popen(argv, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                                       stderr=err, bufsize=0)  # fmt: skip
        try:
            first, second = _read_lines(process, 2, WAIT)
            found = re.search(r": (http://\S+/)$", first)
            assert first.startswith(f"dashboard of namespace {namespace!r}") and found, first
            login = None
            if token is None:
                assert second.startswith("read-only"), second
            else:
                match = LOGIN_LINE.match(second)
                assert match is not None, second
                login = match.group(1)
                assert login == f"{found.group(1)}login?token={token}", login
        except BaseException:
            cls.end(process)
            raise
        return cls(process, found.group(1), login, log)

    @staticmethod
    def end(process: subprocess.Popen[bytes]) -> None:
        stop_process(process)
        if process.stdout is not None:
            process.stdout.close()

    def close(self) -> None:
        self.end(self.process)


def start_worker(redis_url: str, namespace: str, log: Path) -> subprocess.Popen[bytes]:
    """A worker process of the demo app (``chongming_redis.demo.app:app``, whose ``render``
    task checks in after every frame) on ``namespace``."""
    argv = [sys.executable, "-m", "chongming_redis.cli", "worker", "chongming_redis.demo.app:app",
            f"--redis={redis_url}", f"--namespace={namespace}", "--concurrency=8",
            "--grace=1", "--log-level=WARNING"]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=child_env(), stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
