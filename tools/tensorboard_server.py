"""A TensorBoard server for docs screenshots and tests: the installed TensorBoard on a free local port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def scalars_served(url: str) -> bool:
    """Whether the TensorBoard at ``url`` has read a run's scalars (it reads event files after it starts)."""
    with urllib.request.urlopen(f"{url}/data/plugin/scalars/tags", timeout=10) as response:
        return any(json.loads(response.read()).values())


@contextmanager
def tensorboard_server(logdir: Path, ready: Callable[[str], bool] = scalars_served,
                       timeout_s: float = 60.0) -> Iterator[str]:
    """The installed TensorBoard serving ``logdir`` on a free port of 127.0.0.1 (nothing outside this
    machine can reach it). Yields its base URL once ``ready(url)`` holds, polled for at most
    ``timeout_s``; on exit the server is terminated and waited for (killed if it will not stop)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # Its log goes to a file, not a pipe: a pipe nobody reads fills up and stalls the server.
    log = tempfile.TemporaryFile()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                               "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if server.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"tensorboard exited with {server.returncode}: {log.read()[-2000:].decode()}")
            try:
                if ready(url):
                    break
            except OSError:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensorboard on {url} was not ready within {timeout_s:g} s")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        log.close()
