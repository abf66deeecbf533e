"""The model layer of the agent loop: one request in, one (streamed) response out.

:class:`AnthropicModel` talks to the Messages API through the official SDK;
:class:`ScriptedModel` replays a script, for tests and the demo. Both speak plain,
JSON-able dicts (Messages API block shapes), so a turn can be stored in an event
log and replayed without the SDK's types.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio
import msgspec

from .errors import MissingAPIKeyError, ModelConfigError, ModelError, describe

__all__ = [
    "AnthropicModel",
    "Model",
    "ModelConfigError",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "Usage",
    "resolve_model",
]

DEFAULT_MODEL = "claude-sonnet-4-6"

_EPHEMERAL = {"type": "ephemeral"}
# Status codes the SDK itself retries; still failing after its retries, a later retry may work.
_RETRYABLE_STATUS = frozenset({408, 409, 429})
# Error types of an `error` event sent mid-stream, after a 200 (the SDK cannot retry those).
_RETRYABLE_ERROR_TYPES = frozenset(
    {"rate_limit_error", "timeout_error", "api_error", "overloaded_error"}
)


if TYPE_CHECKING:
    import anthropic

# The SDK is imported on first use: it is large (~170k objects, about a second to
# import), and a runtime that never talks to Claude should not pay for it.


class Usage(msgspec.Struct, kw_only=True, omit_defaults=False):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens
            + other.cache_creation_input_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
        )

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_creation_input_tokens
            + self.cache_read_input_tokens
        )


class ModelRequest(msgspec.Struct, kw_only=True):
    """One request to a model, in the Messages API's shapes.

    ``tools`` holds the agent's tools and then its server tools (the API runs
    those). The options after ``max_tokens`` are the agent's (agent_options.py
    checked them), ``None`` when not set: ``thinking``, ``tool_choice``,
    ``stop_sequences``, ``metadata`` (``user_id`` from the run's trusted
    identity), ``service_tier``, ``extra_headers`` and ``betas`` (sent as the
    ``anthropic-beta`` header), ``output_config`` (``format``, ``effort``).
    """

    model: str
    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = []
    max_tokens: int = 4096
    thinking: dict[str, Any] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    extra_headers: dict[str, str] | None = None
    betas: list[str] | None = None
    output_config: dict[str, Any] | None = None


class ModelResponse(msgspec.Struct, kw_only=True):
    """One model response, as the API returned it (block dicts in Messages API shapes).

    ``stop_reason`` is the API's (``end_turn``, ``tool_use``, ``max_tokens``,
    ``stop_sequence``, ``pause_turn``, ``refusal``, ``model_context_window_exceeded``);
    ``stop_sequence`` the custom stop sequence matched, ``stop_details`` the API's
    details of the stop (a refusal's ``category`` and ``explanation``), and
    ``server_tool_use`` the server-tool requests made (``{"web_search_requests": 1}``).
    """

    content: list[dict[str, Any]]
    stop_reason: str
    # A struct default must be a factory: msgspec refuses a shared mutable instance.
    usage: Usage = msgspec.field(default_factory=Usage)
    model: str = ""
    stop_sequence: str | None = None
    stop_details: dict[str, Any] | None = None
    server_tool_use: dict[str, int] | None = None


@runtime_checkable
class Model(Protocol):
    name: str

    async def complete(
        self, request: ModelRequest, *, on_text: Callable[[str], None] | None = None
    ) -> ModelResponse:
        """Answer one request; ``on_text`` gets each text delta as it arrives.

        Must be cancellable: cancelling the awaiting task releases the stream and
        raises ``CancelledError``.
        """
        ...


class AnthropicModel:
    """A Claude model behind the Messages API, streamed.

    Retries of 429/5xx/overloaded are the SDK's own (``max_retries``); what still
    fails becomes a :class:`ModelError`. Each request carries three prompt-cache
    breakpoints: the system prompt, the last tool and the last message block, so
    consecutive turns of one conversation read the whole prefix from the cache.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        client: anthropic.AsyncAnthropic | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float = 600.0,
    ) -> None:
        self.name = model
        if client is None:
            api_key = api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not api_key:
                raise MissingAPIKeyError(
                    f"ANTHROPIC_API_KEY is not set; needed for model {model!r}"
                )
            import anthropic

            client = anthropic.AsyncAnthropic(
                api_key=api_key, max_retries=max_retries, timeout=timeout
            )
        self.client = client

    def __repr__(self) -> str:
        return f"AnthropicModel({self.name!r})"

    async def complete(
        self, request: ModelRequest, *, on_text: Callable[[str], None] | None = None
    ) -> ModelResponse:
        """Stream one response. ``request.model`` wins over the model's own name if set."""
        model = request.model or self.name
        finished = False
        try:
            # Leaving the `async with` (also by cancellation) closes the HTTP response.
            async with self.client.messages.stream(**_stream_params(request, model)) as stream:
                async for event in stream:
                    if event.type == "text":
                        if on_text is not None:
                            on_text(event.text)
                    elif event.type == "message_stop":
                        finished = True
                if not finished:
                    raise ModelError(
                        f"model {model!r} call failed: the response stream ended before message_stop",
                        retryable=True,
                        model=model,
                    )
                message = await stream.get_final_message()
        except Exception as exc:
            import anthropic
            import httpx2

            if not isinstance(exc, anthropic.APIError | httpx2.TransportError):
                raise
            raise _model_error(model, exc) from exc
        usage = message.usage
        server_tools = getattr(usage, "server_tool_use", None)
        server_tool_use = {
            name: int(count)
            for name, count in (
                server_tools.model_dump() if server_tools is not None else {}
            ).items()
            if count
        }
        details = getattr(message, "stop_details", None)
        return ModelResponse(
            content=[_block_dict(block) for block in message.content],
            stop_reason=message.stop_reason or "",
            usage=Usage(
                input_tokens=usage.input_tokens or 0,
                output_tokens=usage.output_tokens or 0,
                cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
                cache_read_input_tokens=usage.cache_read_input_tokens or 0,
            ),
            model=message.model,
            stop_sequence=message.stop_sequence,
            stop_details=details.model_dump(mode="json", exclude_none=True) if details else None,
            server_tool_use=server_tool_use or None,
        )

    async def count_tokens(self, request: ModelRequest) -> int:
        """The input tokens of ``request``, counted by the API (``messages.count_tokens``);
        the agent asks only when its own estimate comes near its context budget."""
        model = request.model or self.name
        params = _stream_params(request, model)
        for name in _NOT_COUNTED:  # count_tokens takes the input, not the output's settings
            params.pop(name, None)
        try:
            counted = await self.client.messages.count_tokens(**params)
        except Exception as exc:
            import anthropic
            import httpx2

            if not isinstance(exc, anthropic.APIError | httpx2.TransportError):
                raise
            raise _model_error(model, exc) from exc
        return int(counted.input_tokens)


# Params of messages.create that messages.count_tokens does not take.
_NOT_COUNTED = ("max_tokens", "stop_sequences", "metadata", "service_tier")
# Request options sent as they are, when set.
_PASSED = ("thinking", "tool_choice", "stop_sequences", "metadata", "service_tier", "output_config")


def _stream_params(request: ModelRequest, model: str) -> dict[str, Any]:
    """Messages API params with cache breakpoints, copied where marked; the request's
    options as they are, ``betas`` joined into the ``anthropic-beta`` header.

    The caller's request is never mutated: the agent loop sends the same history
    again next turn, and breakpoints left behind would pile up past the API's
    limit of four.
    """
    params: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "messages": list(request.messages),
    }
    if request.system:
        params["system"] = [{"type": "text", "text": request.system, "cache_control": _EPHEMERAL}]
    if request.tools:
        tools = list(request.tools)
        tools[-1] = {**tools[-1], "cache_control": _EPHEMERAL}
        params["tools"] = tools
    messages = params["messages"]
    if messages:
        last = dict(messages[-1])
        content = last.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if content:
            content = list(content)
            content[-1] = {**content[-1], "cache_control": _EPHEMERAL}
            last["content"] = content
            messages[-1] = last
    for name in _PASSED:
        value = getattr(request, name)
        if value is not None:
            params[name] = value
    headers = dict(request.extra_headers or {})
    if request.betas:
        named = [h for h in headers if h.lower() == "anthropic-beta"]
        joined = ",".join(headers.pop(h) for h in named)
        given = [b.strip() for b in joined.split(",") if b.strip()]
        headers["anthropic-beta"] = ",".join(dict.fromkeys([*given, *request.betas]))
    if headers:
        params["extra_headers"] = headers
    return params


def _block_dict(block: Any) -> dict[str, Any]:
    """A response block as a plain dict, with everything the API returned that it takes
    back: a text block's ``citations``, a tool_use block's ``caller`` and
    ``toolset_name``, every field of the other blocks (thinking, server tools, ...)."""
    if block.type == "text":
        out: dict[str, Any] = {"type": "text", "text": block.text}
        citations = getattr(block, "citations", None)
        if citations:
            out["citations"] = [_citation(c) for c in citations]
        return out
    if block.type == "tool_use":
        out = {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
        for extra in ("caller", "toolset_name"):
            value = getattr(block, extra, None)
            if value is not None:
                out[extra] = (
                    value.model_dump(mode="json", exclude_none=True)
                    if hasattr(value, "model_dump")
                    else value
                )
        return out
    return block.model_dump(mode="json", exclude_none=True)


def _citation(citation: Any) -> dict[str, Any]:
    """A citation as the API takes it back: its null titles stay (the request params
    require the key), the response-only ``file_id`` goes when it is null."""
    out: dict[str, Any] = citation.model_dump(mode="json")
    if out.get("file_id", "") is None:
        del out["file_id"]
    return out


def _retry_after(exc: Exception) -> float | None:
    """The seconds a response's ``retry-after-ms`` or ``retry-after`` header asks for."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue  # an HTTP date: not worth parsing, the agent's own backoff applies
        if seconds >= 0:
            return seconds
    return None


def _model_error(model: str, exc: Exception) -> ModelError:
    import anthropic
    import httpx2

    if isinstance(exc, anthropic.APIStatusError):
        status, error_type = exc.status_code, exc.type
        detail = exc.api_message or exc.message
        # An `error` event mid-stream arrives after a 200, so only its type tells what failed.
        where = f"HTTP {status}" if status >= 400 else "error event in the response stream"
        kind = f" {error_type}" if error_type else ""
        retryable = (
            status in _RETRYABLE_STATUS or status >= 500 or error_type in _RETRYABLE_ERROR_TYPES
        )
        request_id = f" (request id {exc.request_id})" if exc.request_id else ""
        return ModelError(
            f"model {model!r} call failed: {where}{kind}: {detail}{request_id}",
            retryable=retryable,
            model=model,
            status_code=status,
            error_type=error_type,
            retry_after=_retry_after(exc),
        )
    if isinstance(exc, anthropic.APITimeoutError):
        cause, retryable = "the request timed out", True
    elif isinstance(exc, anthropic.APIConnectionError):
        cause, retryable = f"connection error: {exc.__cause__ or exc.message}", True
    elif isinstance(exc, httpx2.TransportError):
        # The SDK wraps transport errors of the request, not of reading the stream after it.
        cause, retryable = f"{type(exc).__name__} while reading the response stream: {exc}", True
    else:
        cause, retryable = describe(exc), False
    return ModelError(f"model {model!r} call failed: {cause}", retryable=retryable, model=model)


ScriptItem = ModelResponse | str | Callable[[ModelRequest], Any]


class ScriptedModel:
    """Deterministic model for tests and the demo.

    ``script`` is a sequence consumed one item per call, or a callable called on
    every call. An item is a :class:`ModelResponse`, a str (a text reply that ends
    the turn), or a callable taking the request and returning either (it may be
    async, and may raise, e.g. a :class:`ModelError`, to simulate a failed call).

    A response's ``stop_reason`` (and ``stop_sequence``, ``stop_details``,
    ``server_tool_use``) is served as given, so a script plays every ending:
    ``ScriptedModel.text("Half", stop_reason="max_tokens")`` for a truncated run,
    ``stop_reason="refusal"`` for a refused one, ``"pause_turn"`` for a turn the loop
    continues.

    ``requests`` holds every request as it was sent: its message list is a copy,
    the messages in it are not.

    Tool-use blocks with an empty id get ``toolu_{call}_{i}`` (call counts from 1,
    ``i`` is the block's position among the response's tool-use blocks), and a
    response without usage gets a rough estimate, so runs report real numbers.
    """

    def __init__(
        self,
        script: Sequence[ScriptItem] | Callable[[ModelRequest], Any] | ModelResponse | str,
        *,
        name: str = "scripted",
    ) -> None:
        self.name = name
        if isinstance(script, ModelResponse | str):
            script = [script]  # a str is a Sequence too; never replay it char by char
        self._script = script if callable(script) else list(script)
        self._next = 0
        self.requests: list[ModelRequest] = []
        self._last: list[dict[str, Any]] = []  # the messages of the last request
        self._sizes: list[int] = []  # their JSON bytes, as running totals

    def __repr__(self) -> str:
        return f"ScriptedModel(name={self.name!r}, calls={len(self.requests)})"

    async def complete(
        self, request: ModelRequest, *, on_text: Callable[[str], None] | None = None
    ) -> ModelResponse:
        # The message list is copied, not the messages (a deep copy per call is
        # quadratic over a long run): the agent loop never changes a message it
        # handed out (see history.Projection); a caller may still append to its list.
        self.requests.append(msgspec.structs.replace(request, messages=list(request.messages)))
        call = len(self.requests)
        if callable(self._script):
            item: Any = self._script
        elif self._next < len(self._script):
            item = self._script[self._next]
            self._next += 1
        else:
            raise ModelError(
                f"script of model {self.name!r} has no response left for call {call}",
                retryable=False,
                model=self.name,
            )
        if callable(item):
            item = item(request)
        if inspect.isawaitable(item):
            item = await item
        response = self._serve(item, request, call)
        await anyio.sleep(0)
        for block in response.content:
            if block.get("type") == "text":
                for chunk in _chunks(block["text"]):
                    if on_text is not None:
                        on_text(chunk)
                    await anyio.sleep(0)
        return response

    def _serve(self, item: object, request: ModelRequest, call: int) -> ModelResponse:
        if isinstance(item, str):
            item = self.text(item)
        if not isinstance(item, ModelResponse):
            raise TypeError(
                f"script item for call {call} of model {self.name!r} is {type(item).__name__}; "
                "expected a ModelResponse, a str, or a callable returning one"
            )
        content = copy.deepcopy(item.content)
        tool_uses = [block for block in content if block.get("type") == "tool_use"]
        for i, block in enumerate(tool_uses):
            if not block.get("id"):
                block["id"] = f"toolu_{call}_{i}"
        usage = item.usage if item.usage.total_tokens else self._estimate_usage(request, content)
        return ModelResponse(
            content=content,
            stop_reason=item.stop_reason,
            usage=copy.copy(usage),
            model=item.model or self.name,
            stop_sequence=item.stop_sequence,
            stop_details=copy.deepcopy(item.stop_details),
            server_tool_use=dict(item.server_tool_use) if item.server_tool_use else None,
        )

    def _estimate_usage(self, request: ModelRequest, content: list[dict[str, Any]]) -> Usage:
        """About 4 bytes of JSON per token. The agent loop sends the messages of its
        last request again, unchanged (the same dicts), with new ones after them, so
        the sizes of the common prefix are kept and only what is new is measured."""
        messages = request.messages
        sizes = self._sizes  # running totals of the last request's messages, by position
        old = self._last
        keep = 0
        if old and messages and messages[0] is old[0]:
            keep = min(len(old), len(messages))
            while keep and messages[keep - 1] is not old[keep - 1]:
                keep -= 1
        del sizes[keep:]
        total = sizes[-1] if sizes else 0
        for message in messages[keep:]:
            total += len(msgspec.json.encode(message))
            sizes.append(total)
        self._last = messages
        size = len(request.system) + total
        return Usage(input_tokens=max(1, size // 4), output_tokens=_output_tokens(content))

    @staticmethod
    def text(
        text: str,
        *,
        stop_reason: str = "end_turn",
        stop_sequence: str | None = None,
        stop_details: dict[str, Any] | None = None,
    ) -> ModelResponse:
        """A text reply; ``stop_reason`` (e.g. ``"max_tokens"``, ``"refusal"``) says why
        it ended, ``stop_sequence`` which stop sequence it matched."""
        return ModelResponse(
            content=[{"type": "text", "text": text}],
            stop_reason=stop_reason,
            stop_sequence=stop_sequence,
            stop_details=stop_details,
        )

    @staticmethod
    def tool_calls(*calls: tuple[str, dict[str, Any]], text: str | None = None) -> ModelResponse:
        """Tool calls with empty ids; :meth:`complete` assigns them when serving."""
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content += [
            {"type": "tool_use", "id": "", "name": name, "input": dict(args)}
            for name, args in calls
        ]
        return ModelResponse(content=content, stop_reason="tool_use")


def _chunks(text: str) -> list[str]:
    """Split on spaces, keeping them, so the chunks join back to ``text``."""
    parts = text.split(" ")
    return [chunk for chunk in [p + " " for p in parts[:-1]] + parts[-1:] if chunk]


def _output_tokens(content: list[dict[str, Any]]) -> int:
    return sum(
        len(block["text"] if block.get("type") == "text" else msgspec.json.encode(block)) // 4 + 1
        for block in content
    )


def resolve_model(model: str | Model) -> Model:
    """A :class:`Model` as is, or a Claude model by name (``claude-...``)."""
    if isinstance(model, str):
        if model.startswith("claude-"):
            return AnthropicModel(model)
        raise ModelConfigError(
            f"unknown model {model!r}: expected a Claude model name starting with 'claude-' "
            f"(e.g. {DEFAULT_MODEL!r}) or a Model instance such as ScriptedModel"
        )
    # What isinstance(model, Model) checks, without the protocol's slow generic check
    # (it is made for every agent of every wake).
    if hasattr(model, "name") and callable(getattr(model, "complete", None)):
        return model
    raise ModelConfigError(
        f"model {model!r} is neither a model name nor a Model "
        "(an object with a .name and an async .complete(request, on_text=...))"
    )
