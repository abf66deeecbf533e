"""Instrumenting a method: one decorator factory for code that runs around each call.

Tracing and metrics observe the same few methods of the agent loop (a model step, a
tool call). Each observer is written as one async function that gets the call to
make, the instance and the positional arguments, and returns the call's result::

    @around
    async def tool_call(call: Call, calls: Any, args: tuple[Any, ...]) -> Any:
        TOOL_CALLS.labels(args[2].name).inc()
        return await call()

    class ToolCalls:
        @tool_call
        async def _execute(self, run_id, call, tool, params) -> ToolResult: ...

The decorated method keeps its signature, name and docstring (``functools.wraps``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

Call = Callable[[], Awaitable[Any]]  # the decorated method, bound to its arguments
Observer = Callable[[Call, Any, tuple[Any, ...]], Awaitable[Any]]  # (call, self, args)
Method = Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]


def around(observer: Observer) -> Callable[[Method[P, R]], Method[P, R]]:
    """A method decorator that runs ``observer(call, self, args)`` instead of the method;
    the observer awaits ``call()`` once and returns (or raises) what it does."""

    def decorate(method: Method[P, R]) -> Method[P, R]:
        @functools.wraps(method)
        async def observed(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
            result: R = await observer(lambda: method(self, *args, **kwargs), self, args)
            return result

        return observed

    return decorate
