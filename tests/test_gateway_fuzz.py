"""Property-based fuzzing of the gateway against its own OpenAPI description.

Schemathesis generates requests from ``/openapi.json`` (valid and invalid
paths, queries, headers and bodies, and sequences of calls) and sends them to a
real ``wakeful serve`` on the embedded default. No request may make the
gateway fail (a 5xx), and every status code and content type it answers with
must be one the description documents.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.apps.harness import serving_embedded

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance"


@pytest.mark.timeout(1000)
def test_no_request_breaks_the_gateway_or_leaves_its_contract(tmp_path):
    schemathesis = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if schemathesis is None:
        pytest.fail("schemathesis is not installed (it is in the test extra)")
    with (tmp_path / "serve.log").open("w") as log, serving_embedded(stdout=log) as (_, base):
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
    served = (tmp_path / "serve.log").read_text()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Traceback" not in served, served[-4000:]
    assert " passed" in run.stdout  # it did generate and send cases
