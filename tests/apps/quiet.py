"""An app whose handler stays quiet: it writes nothing for ``QUIET_S`` seconds, then replies.

Any real model step, tool or child can be quiet that long; followers of the entity
(``ask``, ``tail -f``, the gateway's event stream) must wait through it.
"""

from __future__ import annotations

import asyncio

from wakeful import HandlerContext, Registry

QUIET_S = 12.0

registry = Registry()


@registry.entity("quiet", description="Replies after a long silence")
async def quiet(ctx: HandlerContext) -> None:
    for message in ctx.wake.messages:
        ctx.record_run()
        await asyncio.sleep(QUIET_S)  # the scenario: a step that produces nothing for a while
        ctx.reply(f"after a silence: {message.payload}")


@registry.entity("echo")
async def echo(ctx: HandlerContext) -> None:
    for message in ctx.wake.messages:
        ctx.record_run()
        ctx.reply(f"echo {message.payload}")
