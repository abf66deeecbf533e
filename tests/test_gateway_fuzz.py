"""Property-based fuzzing of the gateway against its own OpenAPI description.

Schemathesis generates requests from ``/openapi.json`` (valid and invalid
paths, queries, headers and bodies, and sequences of calls) and sends them to a
real ``wakeful serve`` on the embedded default. No request may make the
gateway fail (a 5xx), and every status code and content type it answers with
must be one the description documents.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.apps.harness import free_port

ROOT = Path(__file__).resolve().parents[1]
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance"


@pytest.mark.timeout(1000)
def test_no_request_breaks_the_gateway_or_leaves_its_contract(tmp_path):
    schemathesis = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if schemathesis is None:
        pytest.fail("schemathesis is not installed (it is in the test extra)")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "WAKEFUL_REDIS_URL"}
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wakeful.cli",
            "serve",
            "wakeful.entities:registry",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                httpx.get(f"{base}/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        run = subprocess.run(
            [
                schemathesis,
                "run",
                f"{base}/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                "40",
                "--seed",
                "7",
                "--no-color",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,  # a hang, not slowness: about 70 s quiet, several times that loaded
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()
    served = (tmp_path / "serve.log").read_text()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Traceback" not in served, served[-4000:]
    assert " passed" in run.stdout  # it did generate and send cases
