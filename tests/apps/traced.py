"""The ready entity types, in a worker that exports its spans as JSON lines.

``wakeful worker tests.apps.traced:registry`` with ``WAKEFUL_TEST_SPANS=<file>``:
each span is appended to the file when it ends (tests/test_tracing.py reads them).
"""

from __future__ import annotations

import os

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from wakeful import tracing
from wakeful.entities import registry

__all__ = ["registry"]

_out = open(os.environ["WAKEFUL_TEST_SPANS"], "a")  # noqa: SIM115 - open for the process
_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(out=_out, formatter=lambda span: span.to_json(indent=None) + "\n")
    )
)
tracing.set_tracer_provider(_provider)
