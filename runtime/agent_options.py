"""The options of the agent loop, checked where they are given.

``define_agent(..., max_steps=10)`` and ``ctx.use_agent(..., tool_concurrency=2)``
take the loop's options as keywords. An unknown or mistyped one must fail where it
is written (a :class:`ToolContractError` naming it), not as a ``TypeError`` at every
wake that ends with the entity parked after its retries, nor as a ``400`` from the
Messages API at every run.

The request options (``thinking``, ``tool_choice``, ``stop_sequences``, ``metadata``,
``user_id_from``, ``service_tier``, ``extra_headers``, ``betas``, ``output_format``,
``effort``, ``server_tools``) are checked against the API's rules here, alone
(:func:`check_agent_options`) and together (:func:`check_combination`: a thinking
budget below ``max_output_tokens``, a ``tool_choice`` that names a tool the agent
has and that thinking allows); :class:`RequestOptions` turns them into the fields of
a :class:`~wakeful.models.ModelRequest`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal

import msgspec

from .errors import ToolContractError
from .structured_output import FINAL_TOOL, OutputContract

__all__ = [
    "OPTION_NAMES",
    "AgentOptions",
    "RequestOptions",
    "check_agent_options",
    "check_combination",
]

# RFC 9110 field names; values without control characters (no header splitting).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")
_BETA = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
# Headers the SDK (or HTTP) owns: set the credentials on the model's client instead.
_RESERVED_HEADERS = frozenset(
    {"x-api-key", "authorization", "content-type", "content-length", "host", "transfer-encoding"}
)
# Server tools: the API runs them (the loop only keeps their blocks); each family's
# tools must carry the family's name.
_SERVER_TOOL = re.compile(
    r"(web_search|web_fetch|code_execution|tool_search_tool_regex|tool_search_tool_bm25)_\d{8}"
)
_USER_ID_MAX = 256  # the API's limit on metadata.user_id


class _Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class ThinkingEnabled(_Strict, tag_field="type", tag="enabled"):
    budget_tokens: Annotated[int, msgspec.Meta(ge=1024)]  # the API's minimum
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(_Strict, tag_field="type", tag="adaptive"):
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Strict, tag_field="type", tag="disabled"):
    pass


class ToolChoiceAuto(_Strict, tag_field="type", tag="auto"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Strict, tag_field="type", tag="any"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Strict, tag_field="type", tag="tool"):
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Strict, tag_field="type", tag="none"):
    pass


class Metadata(_Strict):
    user_id: Annotated[str, msgspec.Meta(min_length=1, max_length=_USER_ID_MAX)] | None = None


class OutputFormat(_Strict, tag_field="type", tag="json_schema"):
    schema: dict[str, Any]


Thinking = ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled
ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone
Effort = Literal["low", "medium", "high", "xhigh", "max"]


class AgentOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The keyword options of :class:`~wakeful.agent.Agent` (see its constructor)."""

    max_steps: Annotated[int, msgspec.Meta(ge=1)] = 25
    max_run_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] = 4096
    tool_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 8
    # Context management (their ranges are checked by context_window.ContextPolicy).
    context_window: int | None = None
    context_strategy: str = "compact"
    context_budget: float = 0.8
    keep_turns: int = 2
    # How long (seconds, in all) a run waits out transient model errors (overloaded, rate
    # limited) on durable timers before it fails; 0: it fails at the first one.
    model_retry_total_s: Annotated[float, msgspec.Meta(ge=0)] = 120.0
    # The Messages API request (RequestOptions below).
    thinking: Thinking | None = None
    tool_choice: ToolChoice | Literal["auto", "any", "none"] | None = None
    stop_sequences: list[Annotated[str, msgspec.Meta(min_length=1)]] | None = None
    metadata: Metadata | None = None
    user_id_from: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    extra_headers: dict[str, str] | None = None
    betas: list[str] | None = None
    output_format: OutputFormat | None = None
    effort: Effort | None = None
    server_tools: list[dict[str, Any]] | None = None
    # Structured output (structured_output.py checks the type itself).
    output_type: Any = None
    output_retries: Annotated[int, msgspec.Meta(ge=0)] = 2


OPTION_NAMES = tuple(f.name for f in msgspec.structs.fields(AgentOptions))
REQUEST_OPTION_NAMES = (
    "thinking",
    "tool_choice",
    "stop_sequences",
    "metadata",
    "user_id_from",
    "service_tier",
    "extra_headers",
    "betas",
    "output_format",
    "effort",
    "server_tools",
)


def check_agent_options(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Return ``options`` unchanged if each is a known option of the right type; else
    raise :class:`ToolContractError` naming the option (``where`` says who took it)."""
    known = ", ".join(OPTION_NAMES)
    for name, value in options.items():
        if name not in OPTION_NAMES:
            raise ToolContractError(f"{where}: unknown option {name!r} (the options are {known})")
        try:
            msgspec.convert({name: value}, AgentOptions)
        except msgspec.ValidationError as exc:
            raise ToolContractError(f"{where}: option {name!r}: {exc}") from None
        problem = _problem(name, value)
        if problem is not None:
            raise ToolContractError(f"{where}: option {name!r}: {problem}")
    return dict(options)


def _problem(name: str, value: Any) -> str | None:
    """What the API would refuse in one option that its type does not say."""
    if value is None:
        return None
    if name == "stop_sequences":
        for i, sequence in enumerate(value):
            if not sequence.strip():
                return f"stop sequence {i} ({sequence!r}) has no non-whitespace character"
    elif name == "extra_headers":
        for header, text in value.items():
            if not _HEADER_NAME.fullmatch(header):
                return f"{header!r} is not a valid header name"
            if header.lower() in _RESERVED_HEADERS:
                return (
                    f"the header {header!r} is the client's: set credentials and transport "
                    "headers on the model's client (AnthropicModel(client=...)), not per request"
                )
            if not _HEADER_VALUE.fullmatch(text):
                return f"the value of header {header!r} has a control character"
    elif name == "betas":
        for beta in value:
            if not _BETA.fullmatch(beta):
                return f"{beta!r} is not a beta name (like 'interleaved-thinking-2025-05-14')"
    elif name == "server_tools":
        names: set[str] = set()
        for i, spec in enumerate(value):
            problem = _server_tool_problem(spec)
            if problem is not None:
                return f"server tool {i}: {problem}"
            tool_name = server_tool_spec(spec)["name"]
            if tool_name in names:
                return f"two server tools are named {tool_name!r}"
            names.add(tool_name)
    elif name == "output_type":
        return OutputContract.type_problem(value)
    return None


def _server_tool_problem(spec: dict[str, Any]) -> str | None:
    kind = spec.get("type")
    if not isinstance(kind, str):
        return "needs a 'type' such as 'web_search_20250305'"
    match = _SERVER_TOOL.fullmatch(kind)
    if match is None:
        return (
            f"type {kind!r} is not a server tool the API runs (web_search_*, web_fetch_*, "
            "code_execution_*, tool_search_tool_*_*, each with its date); define your own "
            "tools as tools of the agent"
        )
    name = spec.get("name", match.group(1))
    if name != match.group(1):
        return f"a {kind!r} tool must be named {match.group(1)!r}, not {name!r}"
    return None


def server_tool_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A server tool as sent: with its family's name if it gave none."""
    match = _SERVER_TOOL.fullmatch(spec["type"])
    assert match is not None  # checked by check_agent_options
    return {"name": match.group(1), **spec}


def check_combination(
    options: Mapping[str, Any], where: str, tool_names: Collection[str] | None = None
) -> None:
    """The rules between options (and the agent's tools, when ``tool_names`` is given):
    a thinking budget below ``max_output_tokens``; no forced ``tool_choice`` with
    thinking (the API allows only ``auto`` and ``none`` then); a ``tool_choice`` of
    ``{"type": "tool"}`` naming one of the agent's tools; server tools named apart
    from the agent's tools; one way of shaping the answer."""
    given = msgspec.convert({k: v for k, v in options.items() if k in OPTION_NAMES}, AgentOptions)
    thinking, choice = given.thinking, given.tool_choice
    if isinstance(thinking, ThinkingEnabled) and thinking.budget_tokens >= given.max_output_tokens:
        raise ToolContractError(
            f"{where}: option 'thinking': budget_tokens ({thinking.budget_tokens}) must be less "
            f"than max_output_tokens ({given.max_output_tokens}); raise max_output_tokens"
        )
    thinks = isinstance(thinking, ThinkingEnabled | ThinkingAdaptive)
    kind = _choice_kind(choice)
    if thinks and choice is not None and kind in ("any", "tool"):
        raise ToolContractError(
            f"{where}: option 'tool_choice': {kind!r} forces a tool call, which the API "
            "refuses with thinking on; use 'auto' or 'none', or turn thinking off"
        )
    if given.output_type is not None and given.output_format is not None:
        raise ToolContractError(
            f"{where}: options 'output_type' and 'output_format' both shape the answer; "
            "give one (output_type validates the answer and lets the model correct it)"
        )
    if given.output_type is not None and kind == "none":
        raise ToolContractError(
            f"{where}: option 'tool_choice': 'none' leaves the model no way to give "
            "the structured answer output_type asks for"
        )
    servers = [server_tool_spec(s)["name"] for s in given.server_tools or []]
    if tool_names is None:
        return
    for server in servers:
        if server in tool_names:
            raise ToolContractError(
                f"{where}: option 'server_tools': the server tool {server!r} has the name "
                "of a tool of the agent; tool names must be unique"
            )
    if isinstance(choice, ToolChoiceTool):
        known = {*tool_names, *servers, *([FINAL_TOOL] if given.output_type else [])}
        if choice.name not in known:
            names = ", ".join(sorted(known)) or "none"
            raise ToolContractError(
                f"{where}: option 'tool_choice': no tool named {choice.name!r} "
                f"(the agent's tools: {names})"
            )


def _choice_kind(choice: Any) -> str | None:
    if choice is None or isinstance(choice, str):
        return choice
    return str(choice.__struct_config__.tag)


class RequestOptions(msgspec.Struct, kw_only=True, frozen=True):
    """The request options of an agent, as the fields of each ModelRequest."""

    thinking: dict[str, Any] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None
    user_id_from: str | None = None
    service_tier: str | None = None
    extra_headers: dict[str, str] | None = None
    betas: list[str] | None = None
    output_config: dict[str, Any] | None = None
    server_tools: list[dict[str, Any]] = []

    @classmethod
    def build(cls, options: Mapping[str, Any]) -> RequestOptions:
        """From checked options (check_agent_options): the API's shapes, as builtins."""
        given = msgspec.convert(
            {k: v for k, v in options.items() if k in REQUEST_OPTION_NAMES}, AgentOptions
        )
        choice = given.tool_choice
        output_config: dict[str, Any] = {}
        if given.output_format is not None:
            output_config["format"] = msgspec.to_builtins(given.output_format)
        if given.effort is not None:
            output_config["effort"] = given.effort
        return cls(
            thinking=msgspec.to_builtins(given.thinking) if given.thinking else None,
            tool_choice=(
                {"type": choice}
                if isinstance(choice, str)
                else msgspec.to_builtins(choice)
                if choice is not None
                else None
            ),
            stop_sequences=given.stop_sequences,
            metadata=msgspec.to_builtins(given.metadata) if given.metadata else None,
            user_id_from=given.user_id_from,
            service_tier=given.service_tier,
            extra_headers=given.extra_headers,
            betas=given.betas,
            output_config=output_config or None,
            server_tools=[server_tool_spec(s) for s in given.server_tools or []],
        )

    def thinks(self) -> bool:
        """Whether thinking is on (the API then allows no forced tool choice)."""
        return self.thinking is not None and self.thinking.get("type") != "disabled"

    def request_fields(self, identity: Mapping[str, str] | None) -> dict[str, Any]:
        """The ModelRequest fields, ``metadata.user_id`` from the run's trusted
        ``identity`` when ``user_id_from`` names one of its claims (never from the
        model or the message); a claim over the API's 256 characters is sent hashed."""
        metadata = dict(self.metadata) if self.metadata else None
        if self.user_id_from is not None and identity:
            claim = identity.get(self.user_id_from)
            if claim:
                if len(claim) > _USER_ID_MAX:
                    claim = "sha256:" + hashlib.sha256(claim.encode()).hexdigest()
                metadata = {**(metadata or {}), "user_id": claim}
        return {
            "thinking": self.thinking,
            "tool_choice": self.tool_choice,
            "stop_sequences": self.stop_sequences,
            "metadata": metadata,
            "service_tier": self.service_tier,
            "extra_headers": self.extra_headers,
            "betas": self.betas,
            "output_config": self.output_config,
        }
