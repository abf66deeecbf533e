"""Checking the content blocks of a tool's result before they are journaled.

A block in the journal is sent to the model with every later request of the
conversation, so one the Messages API refuses (an ``image/svg+xml`` image, an empty
text, a 30 MB picture) would fail that run and every one after it. What a tool
returns for the model (its content, ``to_model_output``) is checked here first:
a block that does not pass is a bug of the tool, reported as one (the model gets an
error result, the operator the full error), and never journaled.

A tool result holds ``text``, ``image``, ``document`` and ``search_result`` blocks;
the first three are checked by the same rules as a message's blocks
(:mod:`wakeful.content_blocks`: media types whose bytes match, sizes, non-blank
text, http(s) urls, file ids). Tool names are checked against the API's rule
``^[a-zA-Z0-9_-]{1,64}$``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import content_blocks
from .errors import InvalidBlockError, InvalidContentError, ToolContractError

__all__ = [
    "TOOL_NAME",
    "check_block",
    "check_tool_name",
    "model_blocks",
]

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # the Messages API's rule for tool names
_RESULT_TYPES = ("text", "image", "document", "search_result")


def check_tool_name(name: object) -> None:
    """Raise :class:`ToolContractError` unless ``name`` is a tool name the API takes."""
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ToolContractError(
            f"tool name {name!r} is not accepted by the Messages API: it must be 1 to 64 "
            "letters, digits, '_' or '-'"
        )


def model_blocks(content: object) -> list[dict[str, Any]]:
    """A tool's content for the model as checked blocks: a str is one text block, a
    single block dict is a list of one (``to_model_output`` may return "an image
    block"), a list is checked block by block. Raises :class:`InvalidBlockError`
    naming the block and why."""
    if isinstance(content, str):
        return [{"type": "text", "text": content or "(empty)"}]
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, list | tuple):
        raise InvalidBlockError(
            f"tool content must be a str, a content block (a dict) or a list of blocks, "
            f"not {type(content).__name__}"
        )
    if not content:
        return [{"type": "text", "text": "(empty)"}]
    blocks = []
    for i, block in enumerate(content):
        check_block(block, f"block {i}", allowed=_RESULT_TYPES)
        blocks.append(dict(block))
    return blocks


def check_block(block: object, where: str, *, allowed: tuple[str, ...] = _RESULT_TYPES) -> None:
    """Raise :class:`InvalidBlockError` (naming ``where``) unless the API takes ``block``."""
    if not isinstance(block, Mapping):
        raise InvalidBlockError(f"{where} is a {type(block).__name__}, not a content block dict")
    kind = block.get("type")
    if kind not in allowed:
        raise InvalidBlockError(
            f"{where} has type {kind!r}; a tool result holds blocks of type {', '.join(allowed)}"
        )
    if kind == "search_result":
        for key in ("source", "title"):
            if not isinstance(block.get(key), str) or not block[key]:
                raise InvalidBlockError(f"{where} (search_result) needs a non-empty {key!r}")
        inner = block.get("content")
        if not isinstance(inner, list) or not inner:
            raise InvalidBlockError(f"{where} (search_result) needs a list of text blocks")
        for j, item in enumerate(inner):
            check_block(item, f"{where} content {j}", allowed=("text",))
        return
    try:
        content_blocks.check_block(dict(block), where)
    except InvalidContentError as exc:
        raise InvalidBlockError(str(exc)) from None
