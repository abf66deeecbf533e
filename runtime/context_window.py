"""How big a model's context window is, how much of it a request takes, and what the
agent does when a conversation outgrows it (the agent's :class:`ContextPolicy`).

Counting is an estimate that never calls the API on the common path: the last
model step's reported usage (the exact size of the conversation up to that
step) plus about four bytes of JSON per token for what was journaled since.
Only when that estimate comes near the budget does the loop ask the model for
an exact count (``Model.count_tokens``, the SDK's ``messages.count_tokens``,
where the model has one).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from .content_blocks import estimate_block_tokens
from .errors import ContextConfigError

# Context windows of current Claude models, in tokens, by name prefix (the longest
# prefix that matches wins). Every current Claude model has 200k by default; the
# 1M-token window of some models is a beta a request opts into, so it is an override.
CONTEXT_WINDOWS: dict[str, int] = {
    "claude-opus-4": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-haiku-4": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-3-5-haiku": 200_000,
    "claude-3-opus": 200_000,
    "claude-3-haiku": 200_000,
    "claude-": 200_000,
}

Strategy = Literal["compact", "trim", "off"]
STRATEGIES: tuple[str, ...] = ("compact", "trim", "off")

# Bytes of JSON per token, for the estimate (English prose runs about 4; JSON a little less).
BYTES_PER_TOKEN = 4


def context_window(model_name: str) -> int | None:
    """The context window of a model by name, or None for a model the table does not
    know (a ``ScriptedModel``: no limit unless the agent sets one)."""
    best = max((p for p in CONTEXT_WINDOWS if model_name.startswith(p)), key=len, default=None)
    return CONTEXT_WINDOWS[best] if best is not None else None


@dataclass(frozen=True)
class ContextPolicy:
    """What the agent does about the size of its conversation.

    ``window``: the model's context window in tokens (None: unlimited). ``budget``:
    the share of the window (less the output reserved, ``max_output_tokens``) a
    request may take before the ``strategy`` applies: ``compact`` (the model
    summarises the older turns), ``trim`` (the oldest whole turns are dropped) or
    ``off``. ``keep_turns``: the recent user turns kept as they are.
    """

    window: int | None
    strategy: Strategy = "compact"
    budget: float = 0.8
    keep_turns: int = 2

    @classmethod
    def build(
        cls,
        model_name: str,
        *,
        context_window: int | None = None,
        context_strategy: str = "compact",
        context_budget: float = 0.8,
        keep_turns: int = 2,
    ) -> ContextPolicy:
        """The policy of an agent, from its options (checked: a bad one is named)."""
        if context_window is not None and (
            not isinstance(context_window, int)
            or isinstance(context_window, bool)
            or context_window < 256
        ):
            raise ContextConfigError(
                f"context_window must be a number of tokens of at least 256, got {context_window!r}"
            )
        if context_strategy not in STRATEGIES:
            raise ContextConfigError(
                f"context_strategy must be one of {', '.join(STRATEGIES)}, got {context_strategy!r}"
            )
        if not isinstance(context_budget, int | float) or not 0.1 <= context_budget <= 1.0:
            raise ContextConfigError(
                f"context_budget must be a share of the window between 0.1 and 1.0, "
                f"got {context_budget!r}"
            )
        if not isinstance(keep_turns, int) or isinstance(keep_turns, bool) or keep_turns < 0:
            raise ContextConfigError(f"keep_turns must be an int of at least 0, got {keep_turns!r}")
        window = context_window if context_window is not None else _window_of(model_name)
        return cls(
            window=window,
            strategy=context_strategy,  # type: ignore[arg-type]
            budget=float(context_budget),
            keep_turns=keep_turns,
        )

    def limit(self, max_output_tokens: int) -> int | None:
        """The most input tokens a request may take before the strategy applies."""
        if self.window is None or self.strategy == "off":
            return None
        return max(1, int((self.window - max_output_tokens) * self.budget))


def _window_of(model_name: str) -> int | None:
    return context_window(model_name)


def estimate_tokens(value: Any) -> int:
    """A rough token count of JSON-able content (messages, a system prompt, tools).

    Images and base64 documents are counted at what the API charges for them, not by
    their base64 text (a 1 MB photo is about 1,600 tokens, not 250,000)."""
    if isinstance(value, str):
        return len(value.encode()) // BYTES_PER_TOKEN + 1
    encoded = msgspec.json.encode(value)
    if b'"base64"' not in encoded:
        return len(encoded) // BYTES_PER_TOKEN + 1
    media = 0
    media_bytes = 0
    for block in _media_blocks(value):
        media += estimate_block_tokens(block) or 0
        media_bytes += len(msgspec.json.encode(block))
    return max(0, len(encoded) - media_bytes) // BYTES_PER_TOKEN + media + 1


def _media_blocks(value: Any) -> Iterator[dict[str, Any]]:
    """The image and base64 document blocks anywhere in ``value`` (also in tool results)."""
    if isinstance(value, dict):
        if estimate_block_tokens(value) is not None:
            yield value
            return
        for item in value.values():
            yield from _media_blocks(item)
    elif isinstance(value, list):
        for item in value:
            yield from _media_blocks(item)


_REFUSED = re.compile(r"(\d+) tokens > (\d+) maximum")


def refused_limit(message: str) -> int | None:
    """The input limit a "prompt is too long: N tokens > M maximum" answer names."""
    match = _REFUSED.search(message)
    return int(match.group(2)) if match else None


def is_prompt_too_long(status_code: int | None, message: str) -> bool:
    """A 400 refusing the request for its size ("prompt is too long: N tokens > M")."""
    return status_code in (400, 413) and (
        "prompt is too long" in message or "too many tokens" in message.lower()
    )
