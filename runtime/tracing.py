"""Tracing with OpenTelemetry: one trace follows a message through every entity it touches.

Wakeful depends on the OpenTelemetry *API* only. Until the application sets a
tracer provider (an SDK's), no span is started at all: each instrumented place
costs one check of the global provider, and nothing is written to the log.
With an SDK, the runtime makes these spans:

    wakeful.send        a client's send or create (PRODUCER)
    wakeful.wake        one activation of an entity (CONSUMER), child of the
                        span that wrote its first traced input, linked to the others
    wakeful.handler     the entity type's handler
    invoke_agent        an agent run (GenAI semantic conventions)
    chat {model}        one model step: gen_ai.request.model, gen_ai.usage.*,
                        gen_ai.response.finish_reasons
    execute_tool {name} one tool call: gen_ai.tool.name, gen_ai.tool.call.id
    wakeful.deliver     one effect delivered to its target (PRODUCER)

The trace context travels *inside* the log: an input event (``Message``,
``Created``, ``ChildRunFinished``, ...) and an ``Effect`` carry an optional
``trace`` field, the W3C ``traceparent`` (and ``tracestate``) of the span that
wrote it. A wake continues the trace of its input, an effect records the span it
was made in (the handler's, a tool call's), and its delivery hands its own
context to the event it appends. So send -> wake -> spawn -> child run ->
``run_finished`` -> parent wake is one trace, across worker processes and
restarts (a retried wake continues the same trace). Entries written before this
field existed, or while tracing was off, have no ``trace`` and start no trace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ParamSpec, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .instrument import Call, Method, around

Carrier = dict[str, str]  # {"traceparent": ..., "tracestate": ...}: W3C trace context

_w3c = TraceContextTextMapPropagator()
_global = trace.get_tracer("wakeful")  # a proxy: follows the provider set later, if any
_override: trace.Tracer | None = None
_NO_SPAN = nullcontext(trace.INVALID_SPAN)
_NO_CARRIER: nullcontext[Carrier | None] = nullcontext(None)


def set_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Make Wakeful's spans with ``provider`` instead of the global one
    (``opentelemetry.trace.set_tracer_provider``, which can be set once per process);
    None goes back to the global provider. Tests use it to capture spans."""
    global _override
    _override = provider.get_tracer("wakeful") if provider is not None else None


# ``trace.get_tracer_provider()`` looks its environment variable up in ``os.environ``
# on every call while no provider is set (the case of every wake without an SDK):
# a few microseconds, several times a wake. ``_no_global_provider`` asks the same two
# things for a fraction of that: the API's module global (set once, by
# ``trace.set_tracer_provider`` or by the first ``get_tracer_provider`` that finds the
# variable) and the environment's own dict, with the key encoded as ``os.environ`` does.
_FAST = all(hasattr(os.environ, a) for a in ("_data", "encodekey")) and hasattr(
    trace, "_TRACER_PROVIDER"
)
_ENV_DATA: Mapping[Any, Any] = getattr(os.environ, "_data", {})
_ENV_KEY: Any = os.environ.encodekey(OTEL_PYTHON_TRACER_PROVIDER) if _FAST else None


def _no_global_provider() -> bool:
    """True only when ``trace.get_tracer_provider()`` would return the default proxy
    without loading anything (no provider set, no provider named in the environment);
    False when it has to be asked."""
    return _FAST and trace._TRACER_PROVIDER is None and _ENV_KEY not in _ENV_DATA


def _active() -> trace.Tracer | None:
    """The tracer to use, or None while no provider is set (the API's default proxy):
    then no span is made at all, not even a no-op one."""
    if _override is not None:
        return _override
    if _no_global_provider() or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return _global


P = ParamSpec("P")
R = TypeVar("R")


def tracing_on() -> bool:
    """Whether spans are made (a tracer provider is set)."""
    return _active() is not None


def carrier(span: Span | None = None) -> Carrier | None:
    """The W3C context of ``span`` (default: the current one), or None when no span
    records (no SDK, or tracing off): then nothing is written to the log."""
    span = span if span is not None else trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None
    out: Carrier = {}
    _w3c.inject(out, context=trace.set_span_in_context(span))
    return out or None


def context_of(trace_field: Mapping[str, str] | None) -> Context | None:
    """The context a ``trace`` field carries, or None (absent, or not a W3C context)."""
    if not trace_field or not isinstance(trace_field, Mapping):
        return None
    context = _w3c.extract(dict(trace_field))
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def send_span(url: str, operation: str = "send") -> AbstractContextManager[Carrier | None]:
    """A client's send (or create, cancel, delete) to ``url``; yields the carrier
    to put in the event it appends."""
    tracer = _active()
    return _NO_CARRIER if tracer is None else _send_span(tracer, url, operation)


@contextmanager
def _send_span(tracer: trace.Tracer, url: str, operation: str) -> Iterator[Carrier | None]:
    with tracer.start_as_current_span(
        "wakeful.send",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "wakeful",
            "messaging.operation.type": "send",
            "messaging.operation.name": operation,
            "messaging.destination.name": url,
        },
    ) as span:
        yield carrier(span)


def wake_span(url: str, inputs: Sequence[Any], attempt: int = 0) -> AbstractContextManager[Span]:
    """One activation of ``url`` on ``inputs`` (log records): the child of the first
    traced input's span, linked to the spans of the other traced inputs."""
    tracer = _active()
    return _NO_SPAN if tracer is None else _wake_span(tracer, url, inputs, attempt)


@contextmanager
def _wake_span(
    tracer: trace.Tracer, url: str, inputs: Sequence[Any], attempt: int
) -> Iterator[Span]:
    contexts = [c for c in (context_of(getattr(r.event, "trace", None)) for r in inputs) if c]
    parent = contexts[0] if contexts else None
    links = [Link(trace.get_current_span(c).get_span_context()) for c in contexts[1:]]
    with tracer.start_as_current_span(
        "wakeful.wake",
        context=parent,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": "wakeful",
            "messaging.operation.type": "process",
            "messaging.destination.name": url,
            "messaging.batch.message_count": len(inputs),
            "wakeful.entity": url,
            "wakeful.attempt": attempt + 1,
            "wakeful.inputs": [r.id for r in inputs],
        },
    ) as span:
        yield span


def handler_span(url: str, type_name: str) -> AbstractContextManager[Span]:
    """The entity type's handler, inside its wake."""
    tracer = _active()
    if tracer is None:
        return _NO_SPAN
    return tracer.start_as_current_span(
        "wakeful.handler", attributes={"wakeful.entity": url, "wakeful.type": type_name}
    )


def deliver_span(
    sender: str, kind: str, target: str, trace_field: Any
) -> AbstractContextManager[Carrier | None]:
    """Delivering one effect, in the trace of the span that made it; yields the
    carrier for the event the delivery appends to ``target``."""
    tracer = _active()
    return (
        _NO_CARRIER if tracer is None else _deliver_span(tracer, sender, kind, target, trace_field)
    )


@contextmanager
def _deliver_span(
    tracer: trace.Tracer, sender: str, kind: str, target: str, trace_field: Any
) -> Iterator[Carrier | None]:
    with tracer.start_as_current_span(
        "wakeful.deliver",
        context=context_of(trace_field),
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "wakeful",
            "messaging.operation.type": "send",
            "messaging.operation.name": kind,
            "messaging.destination.name": target,
            "wakeful.sender": sender,
        },
    ) as span:
        yield carrier(span)


# -- the agent loop (decorators: one line at each instrumented method) ----------------

Opening = tuple[str, SpanKind, dict[str, Any]]  # a span's name, kind and attributes


def _span_around(
    opens: Callable[[Any, tuple[Any, ...]], Opening],
    ends: Callable[[Span, Any], None] | None = None,
    *,
    error_type: bool = False,
) -> Callable[[Method[P, R]], Method[P, R]]:
    """A method decorator: the call runs in the span ``opens(self, args)`` describes,
    ``ends(span, result)`` records its result (when the span records), and with
    ``error_type`` an exception's class is set as ``error.type``. Without a tracer
    the method runs alone."""

    async def observer(call: Call, obj: Any, args: tuple[Any, ...]) -> Any:
        tracer = _active()
        if tracer is None:
            return await call()
        name, kind, attributes = opens(obj, args)
        with tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
            try:
                result = await call()
            except Exception as exc:
                if error_type:
                    span.set_attribute("error.type", type(exc).__name__)
                raise
            if ends is not None and span.is_recording():
                ends(span, result)
            return result

    return around(observer)


def _run_opens(agent: Any, args: tuple[Any, ...]) -> Opening:
    url = agent.wake.entity_url
    return (
        f"invoke_agent {url}",
        SpanKind.INTERNAL,
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": url,
            "gen_ai.request.model": agent.model.name,
        },
    )


def _run_ends(span: Span, run: Any) -> None:
    span.set_attribute("wakeful.run.status", run.status)
    if run.run_id:
        span.set_attribute("wakeful.run.id", run.run_id)
    if run.error:
        span.set_status(Status(StatusCode.ERROR, run.error))
    _usage(span, run.usage)


def _step_opens(agent: Any, args: tuple[Any, ...]) -> Opening:
    model = agent.model.name
    return (
        f"chat {model}",
        SpanKind.CLIENT,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": agent.max_output_tokens,
        },
    )


def _step_ends(span: Span, response: Any) -> None:
    if response.model:
        span.set_attribute("gen_ai.response.model", response.model)
    span.set_attribute("gen_ai.response.finish_reasons", [response.stop_reason])
    _usage(span, response.usage)


def _tool_opens(calls: Any, args: tuple[Any, ...]) -> Opening:
    call: Any = args[1]
    tool: Any = args[2]
    return (
        f"execute_tool {tool.name}",
        SpanKind.INTERNAL,
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool.name,
            "gen_ai.tool.call.id": call["id"],
        },
    )


agent_run = _span_around(_run_opens, _run_ends)
"""``Agent.run``: an ``invoke_agent`` span with the run's id, status and usage."""

model_step = _span_around(_step_opens, _step_ends, error_type=True)
"""One model request of the loop (``Agent._step``): a ``chat {model}`` span."""

tool_call = _span_around(_tool_opens)
"""One tool's execution (``ToolCalls._execute(run_id, call, tool, params)``)."""


def tool_result(is_error: bool) -> None:
    """The current tool call's result: an error result (the model sees it, the run
    goes on) marks the span as failed."""
    if is_error:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, "the tool returned an error result"))


def _usage(span: Span, usage: Any) -> None:
    span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
