"""The options of the agent loop, checked where they are given.

``define_agent(..., max_steps=10)`` and ``ctx.use_agent(..., tool_concurrency=2)``
take the loop's options as keywords. An unknown or mistyped one must fail where it
is written (a :class:`ToolContractError` naming it), not as a ``TypeError`` at every
wake that ends with the entity parked after its retries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from .errors import ToolContractError

__all__ = ["AgentOptions", "check_agent_options"]


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


OPTION_NAMES = tuple(f.name for f in msgspec.structs.fields(AgentOptions))


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
    return dict(options)
