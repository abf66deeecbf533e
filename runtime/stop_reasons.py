"""How a model's stop reason ends an agent run.

The Messages API says why each response stopped. ``end_turn`` and ``stop_sequence``
are answers (the matched sequence is recorded); ``tool_use`` goes on with the calls;
``pause_turn`` (a long server-tool turn paused by the API) is continued by sending the
response back as it is; ``max_tokens`` and ``model_context_window_exceeded`` cut the
answer off (status ``truncated``); ``refusal`` is the model declining (status
``refused``). A truncated or refused run is not reported as a normal answer: ``ask``
raises, parents see the status, the CLI exits with its own code.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["CONTINUED", "REFUSED", "TRUNCATED", "run_status", "stop_error"]

TRUNCATED = frozenset({"max_tokens", "model_context_window_exceeded"})
REFUSED = frozenset({"refusal"})
CONTINUED = frozenset({"pause_turn"})

Ending = Literal["completed", "truncated", "refused"]


def run_status(stop_reason: str | None) -> Ending:
    """The status of a run whose last step stopped for ``stop_reason``."""
    if stop_reason in TRUNCATED:
        return "truncated"
    if stop_reason in REFUSED:
        return "refused"
    return "completed"


def stop_error(
    stop_reason: str | None, stop_details: dict[str, Any] | None, max_output_tokens: int
) -> str | None:
    """What a truncated or refused run reports as its error (None for an answer)."""
    if stop_reason == "max_tokens":
        return (
            f"the answer was cut off at the output limit of {max_output_tokens} tokens "
            "(stop reason max_tokens; raise max_output_tokens)"
        )
    if stop_reason == "model_context_window_exceeded":
        return (
            "the answer was cut off: the model's context window is full "
            "(stop reason model_context_window_exceeded)"
        )
    if stop_reason in REFUSED:
        details = stop_details or {}
        category = details.get("category")
        explanation = details.get("explanation")
        what = "the model refused to answer (stop reason refusal"
        what += f", category {category})" if category else ")"
        return f"{what}: {explanation}" if explanation else what
    return None
