"""The web console in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

The gateway serves the ready ``assistant`` entity (its scripted demo model, no
API key) on a real port; the page talks to it as a user would: it sends a
message and sees the reply streamed, approves a pending memory deletion with
its button, and answers the client tool ``getSelectedText`` from the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from wakeful.entities import registry
from wakeful.events import ActionSettled
from wakeful.gateway import create_app

pytestmark = pytest.mark.anyio
CHROMIUM = os.environ.get("WAKEFUL_CHROMIUM", "/usr/bin/chromium")
TIMEOUT_MS = 15_000


def _chromium() -> str:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("CI"):
            pytest.fail(f"no Chromium at {CHROMIUM}; scripts/test.sh should have installed it")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    return CHROMIUM


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` on a free port of 127.0.0.1; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def browser_page() -> AsyncIterator[Any]:
    """A page of a fresh headless Chromium; fails the test if the page's script raised."""
    from playwright.async_api import async_playwright

    executable = _chromium()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            page = await browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
            assert errors == [], f"the page raised: {errors}"
        finally:
            await browser.close()


@pytest.fixture
async def gateway(cluster: Any) -> AsyncIterator[tuple[str, Any]]:
    """The gateway on a free port, with an in-process worker."""
    rt = await cluster.runtime(registry)
    async with serving(create_app(rt)) as base:
        yield base, rt


@pytest.fixture
async def page(gateway: tuple[str, Any]) -> AsyncIterator[Any]:
    async with browser_page() as page:
        yield page


async def open_entity(page: Any, base: str, entity_id: str) -> None:
    await page.goto(f"{base}/")
    await page.wait_for_selector("#entity-type option[value=assistant]", state="attached")
    await page.select_option("#entity-type", "assistant")
    await page.fill("#entity-id", entity_id)
    await page.click("#open")
    await page.wait_for_selector("#entity-title[data-connection=live]")


async def say(page: Any, text: str) -> None:
    await page.fill("#input", text)
    await page.press("#input", "Enter")


async def last_agent_text(page: Any) -> str:
    return await page.locator(".bubble.agent .text").last.inner_text()


async def test_chat_streams_the_reply(gateway, page):
    base, rt = gateway
    await open_entity(page, base, "web1")
    await say(page, "remember that my color is teal")
    reply = page.locator(
        ".bubble.agent:not(.streaming)", has_text="I'll remember that your color is teal"
    )
    await reply.wait_for()
    # The text arrived as live deltas before the durable step replaced it.
    assert int(await reply.get_attribute("data-deltas") or 0) >= 1
    # The user's message, the tool call and the state panel are drawn from the log.
    await page.locator(".bubble.user", has_text="remember that my color is teal").wait_for()
    await page.locator(".tool[data-state=done]", has_text="memory").wait_for()
    await page.locator("#state [data-collection=kv]", has_text="teal").wait_for()
    await page.locator("#status .status-idle").wait_for()
    assert (await rt.state("/assistant/web1"))["kv"] == [{"key": "color", "value": "teal"}]


async def test_approve_a_pending_call(gateway, page):
    base, rt = gateway
    await rt.ask("/assistant/web2", "remember that my city is Lyon")
    await open_entity(page, base, "web2")
    # The history is replayed from the log.
    await page.locator(".bubble.agent", has_text="your city is Lyon").wait_for()
    await say(page, "forget my city")
    approve = page.locator("#actions .action[data-kind=approval] button.approve")
    await approve.wait_for()
    assert (await rt.pending_actions("/assistant/web2"))[0].tool == "memory"
    # One word for a run waiting on an approval: the console shows what the status says.
    assert (await rt.wait_idle("/assistant/web2")).status == "suspended"
    await page.locator("#status .status-suspended", has_text="suspended").wait_for()
    await page.locator("#status dd", has_text="suspended").filter(has_text="run-").wait_for()
    await approve.click()
    await page.locator(".bubble.agent", has_text="Forgot 'city'.").wait_for()
    await page.locator("#actions", has_text="none").wait_for()
    status = await rt.wait_idle("/assistant/web2")
    assert status.pending_actions == 0
    assert (await rt.state("/assistant/web2"))["kv"] == []


async def test_deny_keeps_the_row(gateway, page):
    base, rt = gateway
    await rt.ask("/assistant/web3", "remember that my pet is a cat")
    await open_entity(page, base, "web3")
    await say(page, "forget my pet")
    await page.locator("#actions button.deny").click()
    await page.locator(".tool[data-state=denied]", has_text="memory").wait_for()
    await page.locator(".bubble.agent", has_text="That did not work").wait_for()
    await rt.wait_idle("/assistant/web3")
    assert (await rt.state("/assistant/web3"))["kv"] == [{"key": "pet", "value": "a cat"}]


async def test_tool_data_and_skip_in_the_console(gateway, page):
    base, rt = gateway
    await rt.ask("/assistant/web7", "remember that my pet is a cat")
    await open_entity(page, base, "web7")
    await say(page, "forget my pet")
    await page.locator("#actions .action[data-kind=approval] button.skip").wait_for()
    # Tool data (a client's, for the pending call) shows on the call's card.
    [action] = await rt.pending_actions("/assistant/web7")
    await rt.set_tool_data("/assistant/web7", action.tool_call_id, {"reviewed_by": "ops"})
    await page.locator(".tool .data", has_text="reviewed_by").wait_for()
    await page.locator("#actions .action[data-kind=approval] button.skip").click()
    await page.locator(".tool", has_text="memory").filter(has_text="skipped").wait_for()
    await page.locator("#actions", has_text="none").wait_for()
    await rt.wait_idle("/assistant/web7")
    [answer] = [
        r.event async for r in rt.events("/assistant/web7") if isinstance(r.event, ActionSettled)
    ]
    assert answer.decision == "skipped" and answer.error == "skipped in the console"
    assert (await rt.state("/assistant/web7"))["kv"] == [{"key": "pet", "value": "a cat"}]


async def test_page_answers_the_client_tool(gateway, page):
    base, rt = gateway
    await open_entity(page, base, "web4")
    # Select "append-only log" in the page text, as a user would with the mouse.
    await page.evaluate(
        """() => {
            const node = document.querySelector('#page-text').firstChild;
            const start = node.textContent.indexOf('append-only log');
            const range = document.createRange();
            range.setStart(node, start);
            range.setEnd(node, start + 'append-only log'.length);
            getSelection().removeAllRanges();
            getSelection().addRange(range);
        }"""
    )
    await page.locator("#selection", has_text="append-only log").wait_for()
    await say(page, "what did I select?")
    await page.locator(".bubble.agent", has_text="You selected: append-only log").wait_for()
    card = page.locator(".tool[data-state=done]", has_text="getSelectedText")
    assert "append-only log" in await card.locator(".result").inner_text()
    answers = [
        r.event async for r in rt.events("/assistant/web4") if isinstance(r.event, ActionSettled)
    ]
    assert [(a.decision, a.output) for a in answers] == [("output", {"text": "append-only log"})]


async def test_children_panel_and_navigation(gateway, page):
    base, rt = gateway
    await open_entity(page, base, "web5")
    await say(page, "research what 6 * 7 is")
    await page.locator(".bubble.agent", has_text="The researcher reports back").wait_for()
    child_link = page.locator("#children a")
    await child_link.wait_for()
    child_url = await child_link.inner_text()
    assert [c.url for c in await rt.children("/assistant/web5")] == [child_url]
    await page.locator("#children .status-completed").wait_for()
    await child_link.click()
    await page.wait_for_selector(f"#entity-title:has-text('{child_url}')")
    await page.locator(".bubble.agent", has_text="42").wait_for()
    await page.locator("#status a", has_text="/assistant/web5").wait_for()


async def test_bad_token_is_reported(cluster):
    """With authentication on, the page says a token is needed instead of failing silently."""
    from wakeful.gateway import bearer_tokens

    rt = await cluster.runtime(registry)
    app = create_app(rt, authenticate=bearer_tokens({"sesame": {"user": "ann"}}))
    async with serving(app) as base, browser_page() as page:
        await page.goto(f"{base}/")
        await page.locator("#error", has_text="Enter a bearer token").wait_for()
        await page.fill("#token", "sesame")
        await page.dispatch_event("#token", "change")
        await page.wait_for_selector("#entity-type option[value=assistant]", state="attached")
        assert await page.locator("#error").inner_text() == ""


async def test_a_reader_can_look_but_not_write(cluster):
    """The console opens an entity its user may only read, and creates nothing."""
    from wakeful.gateway import bearer_tokens

    def readers_read(request: Any) -> bool:
        return request.access == "read" or (request.identity or {}).get("user") == "owner"

    rt = await cluster.runtime(registry)
    await rt.ask("/assistant/ro", "remember that my color is teal")
    tokens = {"r-token": {"user": "reader"}, "o-token": {"user": "owner"}}
    app = create_app(rt, authenticate=bearer_tokens(tokens), authorize=readers_read)
    async with serving(app) as base, browser_page() as page:
        await page.goto(f"{base}/")
        await page.fill("#token", "r-token")
        await page.dispatch_event("#token", "change")
        await open_entity(page, base, "ro")
        await page.locator(".bubble.agent", has_text="your color is teal").wait_for()
        await say(page, "remember that my pet is a cat")
        await page.locator("#error", has_text="403").wait_for()
        # Opening an entity that does not exist would create it: refused, nothing made.
        await page.fill("#entity-id", "new-one")
        await page.click("#open")
        await page.locator("#error", has_text="not allowed to write /assistant/new-one").wait_for()
    assert await rt.list("assistant") == ["/assistant/ro"]
    assert (
        len([m async for m in rt.events("/assistant/ro") if type(m.event).__name__ == "Message"])
        == 1
    )


async def test_a_link_opens_only_what_exists_and_asks_before_creating(gateway, page):
    """A link to a missing entity (another page could link to any id) creates nothing;
    the page asks, and creates the entity only when its button is pressed."""
    from wakeful.errors import EntityNotFoundError

    base, rt = gateway
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    await page.goto(f"{base}/console/#/notes/linked")
    prompt = page.locator("#missing", has_text="No such entity /notes/linked. Create it?")
    await prompt.wait_for()
    with pytest.raises(EntityNotFoundError):
        await rt.status("/notes/linked")
    assert posts == []
    assert await page.locator("#input").is_disabled()
    # An existing entity opens from a link as before.
    await rt.send("/notes/there", "add milk")
    await page.goto(f"{base}/console/#/notes/there")
    await page.wait_for_selector("#entity-title[data-connection=live]")
    await page.locator(".bubble.user", has_text="add milk").wait_for()
    # The button creates the missing one and opens it.
    await page.goto(f"{base}/console/#/notes/linked")
    await page.click("#create-entity")
    await page.wait_for_selector("#entity-title[data-connection=live]")
    assert (await rt.status("/notes/linked")).url == "/notes/linked"
    assert posts == [f"{base}/entities/notes/linked"]


async def test_switching_entities_shows_only_the_open_one(gateway, page):
    """Opening B while A is still opening leaves B's stream, and only B's, on the page."""
    base, rt = gateway
    await rt.ask("/assistant/sw-a", "remember that my color is amber")
    await rt.ask("/assistant/sw-b", "remember that my color is blue")

    async def slow(route: Any) -> None:
        await asyncio.sleep(0.6)
        await route.continue_()

    await page.route("**/entities/assistant/sw-a", slow)
    await page.goto(f"{base}/")
    await page.wait_for_selector("#entity-type option[value=assistant]", state="attached")
    await page.select_option("#entity-type", "assistant")
    await page.fill("#entity-id", "sw-a")
    await page.click("#open")  # A's status read is held back for 0.6 s
    await page.fill("#entity-id", "sw-b")
    await page.click("#open")
    await page.wait_for_selector("#entity-title[data-connection=live]")
    await page.locator(".bubble.agent", has_text="your color is blue").wait_for()
    await asyncio.sleep(1.0)  # A's held-back open has finished by now
    assert (await page.locator("#entity-title").inner_text()).startswith("/assistant/sw-b")
    # New events of A do not show; new events of B do.
    await rt.ask("/assistant/sw-a", "what is my color?")
    await say(page, "what is my color?")
    answer = re.compile(r"^Your color is blue\.$")  # not "...remember that your color is blue."
    await page.locator(".bubble.agent .text", has_text=answer).wait_for()
    text = await page.locator("#messages").inner_text()
    assert "amber" not in text
    assert await page.locator(".bubble.user", has_text="what is my color?").count() == 1


async def test_a_long_history_opens_at_its_end(gateway, page):
    """Opening draws only the latest events, and offers the rest."""
    base, rt = gateway
    await rt.ask("/assistant/long", "remember that my color is teal")
    for n in range(3):
        await rt.ask("/assistant/long", f"calculate {n} + 1")
    await page.goto(f"{base}/console/?history=6#/assistant/long")
    await page.wait_for_selector("#entity-title[data-connection=live]")
    await page.locator(".bubble.agent", has_text="2 + 1 = 3").wait_for()
    earlier = page.locator("#earlier a", has_text="show the whole history")
    await earlier.wait_for()
    assert await page.locator(".bubble.user", has_text="remember that my color").count() == 0
    await earlier.click()
    await page.locator(".bubble.user", has_text="remember that my color is teal").wait_for()
    assert await page.locator("#earlier").count() == 0


async def test_the_page_says_when_no_worker_runs(cluster):
    """Without a live worker the page says so (instead of "pending" forever); the notice
    goes away once a worker holds every partition."""
    rt = await cluster.runtime(registry, run_worker=False)
    async with serving(create_app(rt)) as base, browser_page() as page:
        await page.goto(f"{base}/")
        await page.locator("#workers-notice", has_text="No worker is running").wait_for()
        await cluster.runtime(registry)  # a worker joins and takes every partition
        await page.reload()
        await page.locator("#entity-type option[value=assistant]").wait_for(state="attached")
        await page.wait_for_function("() => document.querySelector('#workers-notice').hidden")
