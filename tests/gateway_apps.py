"""What the gateway's and the console's tests serve: an httpx client on the app
in-process, the bearer tokens of two users, and the entity types they register."""

from __future__ import annotations

from typing import Any

import httpx

from wakeful import HandlerContext, Registry, Wake
from wakeful.entities import assistant, notes
from wakeful.gateway import create_app

TOKENS = {"t-alice": {"user": "alice"}, "t-bob": {"user": "bob"}}
ALICE = {"authorization": "Bearer t-alice"}  # the headers of each token's requests
BOB = {"authorization": "Bearer t-bob"}

FLAKY = {"failing": True}  # the flaky type raises while this is set
LONG = "a-child-with-a-long-id-that-would-not-fit-the-sidebar-" + "x" * 60


def http_for(rt: Any, **options: Any) -> httpx.AsyncClient:
    """An httpx client on ``create_app(rt, **options)``, served in-process (ASGI)."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(rt, **options)), base_url="http://gw"
    )


def register_echo(reg: Registry) -> None:
    """``echo``: replies ``echo <payload>`` to each message."""

    @reg.entity("echo")
    async def echo(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.reply(f"echo {m.payload}")


def ops_registry() -> Registry:
    """What an operator's console looks at: the ready-made types, ``echo``, and:
    ``tree`` (spawns two children a level down; the message is the depth), ``broken``
    (always raises, with a secret in its error), ``flaky`` (raises while
    FLAKY["failing"]), ``wide`` (one child with a long id and a long answer)."""
    reg = Registry()
    notes.register(reg)
    assistant.register(reg)
    register_echo(reg)

    @reg.entity("tree")
    async def tree(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            depth = int(m.payload)
            for n in range(2 if depth > 0 else 0):
                await ctx.spawn(
                    "tree",
                    f"{ctx.entity_id}.{n}",
                    initial_message=str(depth - 1),
                    wake=Wake.run_finished(include_response=True),
                )
            ctx.reply(f"depth {depth}")

    @reg.entity("broken")
    async def broken(ctx: HandlerContext) -> None:
        raise RuntimeError("boom: the disk is full")

    @reg.entity("flaky")
    async def flaky(ctx: HandlerContext) -> None:
        if FLAKY["failing"]:
            raise RuntimeError("not yet")
        for m in ctx.wake.messages:
            ctx.reply(f"done {m.payload}")

    @reg.entity("wide")
    async def wide(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "go":
                await ctx.spawn(
                    "wide", LONG, initial_message="x", wake=Wake.run_finished(include_response=True)
                )
            else:
                ctx.reply("a long answer without spaces " + "y" * 300)

    return reg
