"""llama.cpp's server-test conftest, run against `minfer serve`: the same fixtures (a port per
xdist worker, every server stopped after each test), without the session-wide model download,
as the stand-in `llama-server` beside this file takes local models. Loaded with `-p` by
scripts/llama-server-tests.sh, which runs the suite with `--noconftest` from llama.cpp's own
tests directory, so the suite's relative paths (its chat templates) resolve as upstream.
"""
import os
import time

import pytest
import utils
from utils import server_instances

_start = utils.ServerProcess.start


def _start_when_ready(self, timeout_seconds=utils.DEFAULT_HTTP_TIMEOUT):
    """The suite waits for `/health` to answer 200, which llama-server withholds until its model
    is loaded. minfer's `/health` is liveness and answers 200 from the moment the port is bound
    (readiness is `/ready`), so the start also waits for `/ready`: the suite's first request
    would otherwise meet a model still loading."""
    _start(self, timeout_seconds)
    if self.external_server:
        return
    headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
    deadline = time.time() + timeout_seconds
    while time.time() < deadline:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"Server process died with return code {self.process.returncode}")
        try:
            if self.make_request("GET", "/ready", headers=headers).status_code == 200:
                return
        except Exception:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"minfer did not become ready within {timeout_seconds} seconds")


utils.ServerProcess.start = _start_when_ready


@pytest.fixture(scope="session", autouse=True)
def configure_worker_port(request):
    worker_id = getattr(request.config, "workerinput", {}).get("workerid", "master")
    if worker_id != "master":
        os.environ["PORT"] = str(8080 + int(worker_id[2:]) * 10)


@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    yield
    for server in set(server_instances):
        server.stop()
