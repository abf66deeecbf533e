"""``assistant`` and ``researcher``: agents with memory, a calculator and delegation.

The ``assistant`` keeps facts in its ``kv`` collection (the ``memory`` tool),
does arithmetic with the ``calculator``, and hands research to a
``researcher`` child with the runtime's ``spawn_agent`` tool. It never waits for
the child: its run ends after dispatching, and the child's finished run wakes
it again with the findings, which it then answers with.

With ``ANTHROPIC_API_KEY`` set both talk to Claude. Without it they use
scripted stand-ins (:func:`demo_model`, :func:`researcher_demo_model`): small
functions of the request that pick a plausible next step, so the demo and the
tests run offline and deterministically. They are not language models: they
understand "remember that my X is Y", "what is my X?", "forget my X", "what do
you remember?", "calculate <expr>" and "research ...", and a researcher only
works out the arithmetic it finds in its task.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable
from typing import Any

import msgspec

from wakeful import HandlerContext, Registry
from wakeful.compaction import SUMMARY_REQUEST, SUMMARY_SYSTEM
from wakeful.models import (
    DEFAULT_MODEL,
    Model,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    resolve_model,
)
from wakeful.tools import MEMORY_COLLECTION, calculator, memory_store

ASSISTANT_PROMPT = """\
You are a helpful assistant, running as the durable entity {url}: your \
conversation and your memory survive restarts.
- When the user tells you something about themselves, store it with the memory \
tool; check memory before saying you do not know something they may have told you.
- Use the calculator for any arithmetic instead of working it out yourself.
- When a question needs research, dispatch it to an agent of type "researcher" \
with a self-contained task, tell the user in one sentence that you did, and end \
your turn. You will be woken with its findings in a note starting \
"[/researcher/... finished its run]"; then answer the user's question with them.
Be concise."""

RESEARCHER_PROMPT = """\
You are a researcher. Another agent gives you one self-contained task. Work it \
out (use the calculator for arithmetic) and answer with your findings in a few \
sentences: your answer is sent back to the agent that asked. Do not ask \
questions back; nobody will answer them."""


def pick_model(fallback: Callable[[], ScriptedModel] | None = None) -> str | Model:
    """Claude when an API key is set, otherwise a scripted stand-in (``demo_model`` by default)."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        return DEFAULT_MODEL
    return (fallback or demo_model)()


# -- the entity types ---------------------------------------------------------------


ModelHook = Callable[[Model, str], Model]
"""Given the model an agent picked and its entity's URL, the model it uses instead
(the demo's worker processes wrap each one to report its calls)."""


async def handle_assistant(ctx: HandlerContext, wrap_model: ModelHook | None = None) -> None:
    ctx.use_agent(
        system_prompt=ASSISTANT_PROMPT.format(url=ctx.entity_url),
        model=_wrapped(pick_model(), ctx, wrap_model),
        tools=[*ctx.runtime_tools, memory_store(ctx, approve_changes=True), calculator],
    )
    await ctx.agent.run()


async def handle_researcher(ctx: HandlerContext, wrap_model: ModelHook | None = None) -> None:
    """A plain agent: its run's response is the answer the dispatching parent receives."""
    ctx.use_agent(
        system_prompt=RESEARCHER_PROMPT,
        model=_wrapped(pick_model(researcher_demo_model), ctx, wrap_model),
        tools=[calculator],
    )
    await ctx.agent.run()


def _wrapped(model: str | Model, ctx: HandlerContext, wrap_model: ModelHook | None) -> str | Model:
    return model if wrap_model is None else wrap_model(resolve_model(model), ctx.entity_url)


def register(registry: Registry, *, wrap_model: ModelHook | None = None) -> None:
    """Register ``assistant`` and ``researcher``; ``wrap_model`` wraps each wake's model."""
    registry.register(
        "assistant",
        functools.partial(handle_assistant, wrap_model=wrap_model),
        description="Assistant with memory and delegation",
        state={"kv": MEMORY_COLLECTION},
    )
    registry.register(
        "researcher",
        functools.partial(handle_researcher, wrap_model=wrap_model),
        description="Works out one research task (with a calculator) and answers with findings",
    )


# -- scripted stand-ins ---------------------------------------------------------------

_CHILD_FINISHED = re.compile(r"\[(/[a-z][a-z0-9_-]*/\S+) finished its run\]\n(.*)", re.S)
_CHILD_FAILED = re.compile(r"\[(/[a-z][a-z0-9_-]*/\S+) (failed|cancelled): (.*)\]", re.S)
_REMEMBER = re.compile(r"\bremember (?:that )?(?:my )?(.+?) (?:is|are) (.+?)[.!]?$", re.I | re.S)
_RECALL = re.compile(r"\bwhat(?:'s| is| are) my (.+?)\??$", re.I)
_FORGET = re.compile(r"\bforget (?:about )?(?:my )?(.+?)[.!]?$", re.I)
_SELECTION = re.compile(r"\bselect(?:ed|ion)?\b", re.I)
_LIST = re.compile(r"\bwhat do you (?:remember|know)\b", re.I)
_RESEARCH = re.compile(r"\b(?:research|look into|find out|investigate|delegate)\b", re.I)
_CALCULATE = re.compile(r"\b(?:calculate|compute|what(?:'s| is))\s+(.+?)\??$", re.I)
_ARITHMETIC = re.compile(r"[\d(][\d\s.+\-*/%()]*[\d)]")

HELP = (
    "(I am the scripted demo model: set ANTHROPIC_API_KEY to talk to Claude.) I can "
    "remember things ('remember that my X is Y'), recall them ('what is my X?'), forget "
    "or change them (with your approval), read what you selected in the console ('what "
    "did I select?'), calculate ('calculate 2 * (3 + 4)') and hand research to a "
    "researcher ('research ...')."
)


def demo_model() -> ScriptedModel:
    """The assistant's offline stand-in: :func:`assistant_step` on every call."""
    return ScriptedModel(assistant_step, name="scripted-assistant")


def researcher_demo_model() -> ScriptedModel:
    """The researcher's offline stand-in: :func:`researcher_step` on every call."""
    return ScriptedModel(researcher_step, name="scripted-researcher")


def assistant_step(request: ModelRequest) -> ModelResponse:
    """The next step of the assistant, chosen from the latest user message."""
    if request.system == SUMMARY_SYSTEM:  # compacting its conversation (wakeful compact)
        return ScriptedModel.text(_summary(request))
    last = request.messages[-1]
    text = _last_text(last)
    if text is None:  # only tool results: say what they did
        return ScriptedModel.text(_after_tools(request, _tool_results(last)))
    if found := _CHILD_FINISHED.search(text):
        return ScriptedModel.text(f"The researcher reports back: {found.group(2).strip()}")
    if found := _CHILD_FAILED.search(text):
        return ScriptedModel.text(
            f"Sorry, the research did not finish ({found.group(2)}): {found.group(3)}"
        )
    if found := _REMEMBER.search(text):
        key, value = found.group(1).strip(), found.group(2).strip()
        return _call(request, "memory", {"action": "set", "key": key, "value": value})
    if found := _RECALL.search(text):
        return _call(request, "memory", {"action": "get", "key": found.group(1).strip()})
    if found := _FORGET.search(text):
        return _call(request, "memory", {"action": "delete", "key": found.group(1).strip()})
    if _SELECTION.search(text):
        if any(tool["name"] == "getSelectedText" for tool in request.tools):
            return _call(request, "getSelectedText", {})
        return ScriptedModel.text(
            "I cannot see your screen: your client offers no getSelectedText."
        )
    if _LIST.search(text):
        return _call(request, "memory", {"action": "list"})
    if _RESEARCH.search(text):
        task = text.strip()
        return _call(
            request, "spawn_agent", {"agent": "researcher", "task": task}, "I'll delegate that."
        )
    if (found := _CALCULATE.search(text)) and _ARITHMETIC.search(found.group(1)):
        return _call(request, "calculator", {"expression": found.group(1).strip()})
    return ScriptedModel.text(HELP)


def _summary(request: ModelRequest) -> str:
    """A scripted summary: what the user asked, turn by turn."""
    asked = [
        block["text"]
        for message in request.messages
        if message["role"] == "user"
        for block in message["content"]
        if block.get("type") == "text" and block["text"] != SUMMARY_REQUEST
    ]
    return "The user asked: " + "; ".join(asked) if asked else "Nothing was asked yet."


def researcher_step(request: ModelRequest) -> ModelResponse:
    """Work out the arithmetic of the task with the calculator, then report it."""
    last = request.messages[-1]
    results = _tool_results(last)
    if results:
        found = _result_text(results[-1])
        if results[-1].get("is_error"):
            return ScriptedModel.text(f"I could not work it out: {found}")
        return ScriptedModel.text(f"Findings: {found} (computed with the calculator).")
    task = _last_text(last) or ""
    candidates = [m.group(0).strip() for m in _ARITHMETIC.finditer(task)]
    expressions = [c for c in candidates if re.search(r"[\d)]\s*[-+*/%]", c)]
    if not expressions:
        return ScriptedModel.text(
            "I cannot look facts up offline (I am the scripted demo researcher; set "
            "ANTHROPIC_API_KEY to research with Claude), and the task has no arithmetic to do."
        )
    return _call(request, "calculator", {"expression": max(expressions, key=len)})


def _after_tools(request: ModelRequest, results: list[dict[str, Any]]) -> str:
    """A closing sentence for the tool results of the last step."""
    calls = {
        block["id"]: block
        for message in request.messages
        if message["role"] == "assistant"
        for block in message["content"]
        if block.get("type") == "tool_use"
    }
    lines = []
    for result in results:
        call = calls.get(result["tool_use_id"], {})
        name, args, text = call.get("name"), call.get("input") or {}, _result_text(result)
        if result.get("is_error"):
            lines.append(f"That did not work: {text}")
        elif name == "memory" and args.get("action") == "set":
            lines.append(f"Got it: I'll remember that your {args['key']} is {args['value']}.")
        elif name == "memory" and args.get("action") == "get":
            lines.append(text if "Nothing" in text else f"Your {text.replace(':', ' is', 1)}.")
        elif name == "getSelectedText":
            selected = _selected(text)
            lines.append(f"You selected: {selected}" if selected else "You have selected nothing.")
        elif name in ("spawn_agent", "dispatch"):  # "dispatch": its name in older logs
            lines.append(
                "I've asked a researcher to look into it; I'll answer as soon as it reports back."
            )
        else:
            lines.append(text)
    return "\n".join(lines)


def _selected(text: str) -> str:
    """The text of a ``getSelectedText`` result (its output is ``{"text": ...}``)."""
    try:
        output = json.loads(text)
    except ValueError:
        return text
    return str(output.get("text", "")) if isinstance(output, dict) else text


def _call(
    request: ModelRequest, name: str, arguments: dict[str, Any], text: str | None = None
) -> ModelResponse:
    """One tool call with an id derived from the conversation so far.

    ``ScriptedModel`` numbers calls per model instance (``toolu_1_0``), and a new
    instance serves every wake, so its ids would repeat across runs. The
    ``spawn_agent`` tool derives the child id and the effect keys from the call id:
    repeated ids would make a second dispatch reuse the first child (and its
    spawn be dropped as a duplicate). The conversation (with the entity URL in
    the system prompt) only grows, so a digest of it is unique and, unlike a
    random id, the same if the model is asked again after a crash.
    """
    digest = hashlib.sha256(msgspec.json.encode([request.system, request.messages])).hexdigest()
    response = ScriptedModel.tool_calls((name, arguments), text=text)
    for block in response.content:
        if block["type"] == "tool_use":
            block["id"] = f"toolu_{digest[:12]}"
    return response


def _last_text(message: dict[str, Any]) -> str | None:
    """The last text block of a message (the newest input of a user turn), if any."""
    content = message["content"]
    if isinstance(content, str):
        return content
    texts = [b["text"] for b in content if b.get("type") == "text"]
    return texts[-1] if texts else None


def _tool_results(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return (
        [] if isinstance(content, str) else [b for b in content if b.get("type") == "tool_result"]
    )


def _result_text(result: dict[str, Any]) -> str:
    content = result.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if b.get("type") == "text")
