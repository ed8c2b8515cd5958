"""A real `tocsin dev` node for the end-to-end tests (one per session).

The binary is $TOCSIN_BIN (the `tocsin` binary, or the directory holding
it), by default ~/.cache/tocsin/target/x86_64-unknown-linux-gnu/debug/tocsin.
Without $TOCSIN_BIN and with no binary at the default path the node tests
are skipped; with $TOCSIN_BIN set, a missing binary fails them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest

import tocsin

DEFAULT_BIN = Path.home() / ".cache/tocsin/target/x86_64-unknown-linux-gnu/debug/tocsin"
READY_TIMEOUT_S = 60.0


def _bin_path() -> Path:
    given = os.environ.get("TOCSIN_BIN")
    if not given:
        if not DEFAULT_BIN.exists():
            pytest.skip(f"no tocsin binary at {DEFAULT_BIN} (set TOCSIN_BIN)")
        return DEFAULT_BIN
    path = Path(given).expanduser()
    if path.is_dir():
        path = path / "tocsin"
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"TOCSIN_BIN={given}: no executable tocsin binary at {path}")
    return path


def _free_ports(n: int) -> List[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class Node:
    bin: Path
    grpc: str
    http: str
    data: Path
    log: Path

    def cli(self, *args: str, env: Optional[Dict[str, str]] = None, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Runs `tocsin <args> --addr <grpc>` (with ``env`` added to a
        TOCSIN_*-free environment); fails the test on a non-zero exit."""
        cmd = [str(self.bin), *args, "--addr", self.grpc]
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, env={**_clean_env(), **(env or {})}
        )
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"


def _clean_env() -> Dict[str, str]:
    """The environment without TOCSIN_* settings (a token, TLS files, an
    address) that the CLI would otherwise pick up."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TOCSIN_")}


def _ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/readyz", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def node():
    """One `tocsin dev` node on free loopback ports, ready (GET /readyz 200)."""
    binary = _bin_path()
    tmp = Path(tempfile.mkdtemp(prefix="tocsin-pytest-"))
    grpc_port, http_port, peer_port = _free_ports(3)
    n = Node(
        bin=binary,
        grpc=f"127.0.0.1:{grpc_port}",
        http=f"127.0.0.1:{http_port}",
        data=tmp / "data",
        log=tmp / "node.log",
    )
    cmd = [
        str(binary),
        "dev",
        "--data",
        str(n.data),
        "--grpc",
        n.grpc,
        "--http",
        n.http,
        "--peer",
        f"127.0.0.1:{peer_port}",
        "--shards",
        "4",
    ]
    with open(n.log, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_clean_env(),
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _ready(n.http):
            if proc.poll() is not None:
                pytest.fail(f"tocsin dev exited {proc.returncode} before ready; log tail:\n{n.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"tocsin dev not ready after {READY_TIMEOUT_S:.0f} s; log tail:\n{n.log_tail()}")
            time.sleep(0.2)
        yield n
        if proc.poll() is not None:
            pytest.fail(f"tocsin dev died during the tests (exit {proc.returncode}); log tail:\n{n.log_tail()}")
    except BaseException:
        print(f"tocsin dev log tail ({n.log}):\n{n.log_tail()}")
        raise
    finally:
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def client(node):
    with tocsin.Client(node.grpc, timeout=15.0) as c:
        yield c


@pytest.fixture
def namespace():
    """A fresh namespace per test."""
    return f"py-{uuid.uuid4().hex[:10]}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed node test's report ends with the node's log tail."""
    outcome = yield
    report = outcome.get_result()
    n = getattr(item, "funcargs", {}).get("node")
    if report.failed and isinstance(n, Node):
        report.sections.append(("tocsin dev log tail", n.log_tail()))
