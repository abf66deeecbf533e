import msgspec
import pytest

from wakeful import Collection, HandlerContext, Registry

pytestmark = pytest.mark.anyio


class Counter(msgspec.Struct):
    key: str
    n: int


def counter_registry() -> Registry:
    reg = Registry()

    @reg.entity("counter", state={"counts": Collection(row=Counter)})
    async def counter(ctx: HandlerContext) -> None:
        for _ in ctx.wake.messages:
            if "total" in ctx.db.collections.counts:
                ctx.db.actions.counts_update(
                    key="total", updater=lambda r: setattr(r, "n", r.n + 1)
                )
            else:
                ctx.db.actions.counts_insert(row=Counter("total", 1))

    return reg


async def test_counter_counts_every_message(cluster):
    rt = await cluster.runtime(counter_registry())
    for i in range(10):
        await rt.send("/counter/a", {"i": i})
    status = await rt.wait_idle("/counter/a", timeout=10)
    assert status.status == "idle"
    assert await rt.state("/counter/a") == {"counts": [{"key": "total", "n": 10}]}
