"""Structured output: ``output_type=SomeStruct`` makes a run's result a validated value.

The model is given a tool, ``final_answer``, whose input schema is the type's JSON
schema, and is told to answer by calling it (``tool_choice`` ``any`` unless thinking
is on or the agent chose otherwise). Its input is validated here, by msgspec, as the
type: a valid answer settles the call ("accepted") and ends the run with the value
as its output; an invalid one settles it as an error result that says what is wrong,
so the model corrects it in its next step. A turn that ends in text instead is taken
if the text is the JSON of a valid value, else the model is told to call the tool.
After ``output_retries`` corrections the run fails, naming the last error.

Why a tool and not the API's native structured outputs (``output_config.format``,
which stays available as the ``output_format`` option): a tool call works on every
Claude model and on every provider's client, with other tools in the same run and
with a ScriptedModel; its input arrives parsed (no fences or prose to strip); its
result is the natural channel for a correction, keeping every ``tool_use`` answered
in the journal; and validation is msgspec's, so constraints the API's schema subset
does not enforce (``ge``, patterns, lengths) are still checked. Everything is
decided from journaled events, so a crash anywhere resumes to the same decision.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from .agent_tools import AgentTool, ToolResult, struct_schema
from .errors import ToolContractError
from .events import AssistantStep, ToolOutcome

__all__ = ["FINAL_TOOL", "Decision", "OutputContract"]

FINAL_TOOL = "final_answer"
_ACCEPTED = "Accepted."
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n(.*)\n```$", re.DOTALL)


@dataclass(frozen=True)
class Decision:
    """What the run's events say about its answer.

    ``accepted``: ``output`` is the valid value, as JSON builtins; ``exhausted``: the
    run fails with ``error``; ``correct``: tell the model ``error`` and go on;
    ``continue``: ask the model for the next step (a paused turn is not an answer)."""

    kind: Literal["accepted", "exhausted", "correct", "continue"]
    output: Any = None
    error: str = ""


class OutputContract:
    """The answer an agent must give: ``output_type``, with ``retries`` corrections."""

    def __init__(self, output_type: type, retries: int) -> None:
        self.check_type(output_type)
        self.type = output_type
        self.name = output_type.__name__
        self.retries = retries
        self.schema = struct_schema(output_type)

    @staticmethod
    def check_type(output_type: Any) -> None:
        """Raise :class:`ToolContractError` if ``output_type`` cannot be an answer's type."""
        problem = OutputContract.type_problem(output_type)
        if problem is not None:
            raise ToolContractError(f"option 'output_type': {problem}")

    @staticmethod
    def type_problem(output_type: Any) -> str | None:
        """Why ``output_type`` is not a msgspec Struct, a dataclass or a TypedDict whose
        JSON schema is an object (None if it is one)."""
        if not isinstance(output_type, type) or not (
            issubclass(output_type, msgspec.Struct)
            or typing.is_typeddict(output_type)
            or dataclasses.is_dataclass(output_type)
        ):
            return (
                f"{output_type!r} is not a msgspec Struct, a dataclass or a TypedDict "
                "(the answer is a JSON object)"
            )
        try:
            schema = struct_schema(output_type)
        except (TypeError, ValueError) as exc:
            return f"{output_type.__name__} has no JSON schema: {exc}"
        if schema.get("type") != "object":
            return f"{output_type.__name__} is not a JSON object type"
        return None

    def tool(self) -> AgentTool:
        """The tool the model gives its answer with."""
        return AgentTool(
            name=FINAL_TOOL,
            description=(
                f"Give your final answer as a {self.name}, and end your turn. Call this "
                "once you have everything the answer needs; its input is the answer."
            ),
            parameters=self.schema,
            execute=self._take,
            label=f"answer ({self.name})",
            id=f"wakeful.runtime.final_answer/{self.name}",
        )

    async def _take(self, call_id: str, params: Any, signal: Any, on_update: Any) -> ToolResult:
        value, error = self.validate(params)
        if error is not None:
            return ToolResult(self._correction(error), details={"error": error}, is_error=True)
        return ToolResult(_ACCEPTED, details={"output": value})

    def validate(self, raw: Any) -> tuple[Any, str | None]:
        """``(value as builtins, None)`` for a valid answer, ``(None, why)`` otherwise."""
        try:
            value: Any = msgspec.convert(raw, self.type)
        except msgspec.ValidationError as exc:
            return None, f"the answer does not match {self.name}: {exc}"
        return msgspec.to_builtins(value), None

    def value(self, builtins: Any) -> Any:
        """The typed value of an accepted answer."""
        return msgspec.convert(builtins, self.type)

    def _correction(self, error: str) -> str:
        return f"{error[0].upper()}{error[1:]}. Call {FINAL_TOOL} again with a corrected answer."

    def request_fields(self, fields: dict[str, Any], thinks: bool) -> dict[str, Any]:
        """The request's fields with the answer asked for: a tool call is forced
        (``any``: the model may still use its other tools first) unless thinking is
        on (the API refuses forced tools then) or the agent set ``tool_choice``."""
        if fields.get("tool_choice") is None and not thinks:
            return {**fields, "tool_choice": {"type": "any"}}
        return fields

    def decide(self, run_events: list[Any]) -> Decision | None:
        """The decision the run's journaled events make, or None to go on as usual."""
        failures = 0
        last_error = ""
        for event in run_events:
            if isinstance(event, ToolOutcome) and event.name == FINAL_TOOL:
                details = event.details if isinstance(event.details, dict) else {}
                if not event.is_error and "output" in details:
                    return Decision("accepted", output=details["output"])
                failures += 1
                last_error = str(details.get("error") or _text(event.content))
            elif isinstance(event, AssistantStep) and not _calls(event.content):
                if event.stop_reason == "pause_turn":  # the API goes on with it next step
                    continue
                if event.stop_reason == "refusal":
                    return Decision("exhausted", error="the model refused to answer")
                value, error = self._from_text(event.content)
                if error is None:
                    return Decision("accepted", output=value)
                failures += 1
                last_error = error
        last = run_events[-1] if run_events else None
        if isinstance(last, AssistantStep) and last.stop_reason == "pause_turn":
            return Decision("continue")
        if not failures:
            return None
        ended_in_text = isinstance(last, AssistantStep) and not _calls(last.content)
        answered_wrong = isinstance(last, ToolOutcome) and last.name == FINAL_TOOL
        if not (ended_in_text or answered_wrong):
            return None
        if failures > self.retries:
            return Decision(
                "exhausted",
                error=f"the answer did not validate as {self.name} after {failures} "
                f"attempt{'s' if failures > 1 else ''}: {last_error}",
            )
        if ended_in_text:
            return Decision("correct", error=last_error)
        return None  # the error result tells the model; the loop asks it again

    def nudge(self, error: str) -> list[dict[str, Any]]:
        """The user content that tells the model to answer through the tool."""
        return [
            {
                "type": "text",
                "text": f"[{error}. Give your final answer by calling the {FINAL_TOOL} "
                f"tool: its input must be a {self.name}.]",
            }
        ]

    def _from_text(self, content: list[dict[str, Any]]) -> tuple[Any, str | None]:
        text = _text(content).strip()
        fenced = _FENCE.match(text)
        if fenced:
            text = fenced.group(1).strip()
        try:
            raw = json.loads(text)
        except ValueError:
            return None, f"the turn ended without calling {FINAL_TOOL}"
        return self.validate(raw)


def _calls(content: list[dict[str, Any]]) -> bool:
    return any(b.get("type") == "tool_use" for b in content)


def _text(content: list[dict[str, Any]]) -> str:
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")
