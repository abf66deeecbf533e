"""The console as an operator's tool, in a real headless Chromium (see test_console.py):
every entity across types, workers, an entity's journal and tree, the resume, cancel
and delete buttons, and the rough edges of the old page (the id pattern, a bad id,
the children table, a narrow window, the sidebar's list).

Each view is saved as a screenshot (``WAKEFUL_SCREENSHOTS=<dir>``, default a pytest
temporary directory) for a person to look at; the tests assert what the page shows.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gateway_apps import FLAKY, ops_registry
from tests.test_console import browser_page, serving
from wakeful.errors import EntityNotFoundError
from wakeful.events import RunFinished
from wakeful.gateway import bearer_tokens, create_app
from wakeful.urls import ID_PATTERN

pytestmark = pytest.mark.anyio
Shot = Callable[[Any, str], Awaitable[Path]]


@pytest.fixture
def shot(tmp_path_factory: pytest.TempPathFactory) -> Shot:
    """Saves a full-page screenshot of ``page`` as ``<name>.png``; returns its path."""
    root = Path(os.environ.get("WAKEFUL_SCREENSHOTS") or tmp_path_factory.mktemp("console"))
    root.mkdir(parents=True, exist_ok=True)

    async def save(page: Any, name: str) -> Path:
        path = root / f"{name}.png"
        await page.screenshot(path=str(path), full_page=True)
        return path

    return save


@pytest.fixture
async def ops(cluster: Any) -> AsyncIterator[tuple[str, Any]]:
    """The gateway on a free port, with an in-process worker (two attempts per input)."""
    FLAKY["failing"] = True
    rt = await cluster.runtime(ops_registry(), max_attempts=2)
    async with serving(create_app(rt)) as base:
        yield base, rt


@pytest.fixture
async def page(ops: tuple[str, Any]) -> AsyncIterator[Any]:
    async with browser_page() as page:
        yield page


async def goto(page: Any, url: str) -> None:
    await page.goto(url)
    await page.wait_for_selector("#entity-type option[value=assistant]", state="attached")


async def opened(page: Any, base: str, url: str, tab: str = "") -> None:
    await goto(page, f"{base}/console/#{url}{'/' + tab if tab else ''}")
    await page.wait_for_selector("#entity-title[data-connection=live]")


async def confirm(page: Any, yes: bool = True) -> None:
    dialog = page.locator("dialog#confirm[open]")
    await dialog.wait_for()
    await page.click("#confirm-yes" if yes else "#confirm-no")
    await dialog.wait_for(state="hidden")


# -- every entity -----------------------------------------------------------------------


async def test_the_entities_view_filters_by_status_searches_and_pages(ops, page, shot):
    base, rt = ops
    for url, message in [
        ("/notes/n1", "add milk"),
        ("/notes/n2", "add eggs"),
        ("/broken/b1", "go"),
        ("/tree/t1", "0"),
    ]:
        await rt.send(url, message)
    await rt.wait_all_idle()
    await goto(page, f"{base}/console/#entities")
    rows = page.locator("#entities-table tbody tr")
    await page.locator("#entities-table tr[data-url='/tree/t1']").wait_for()
    assert await rows.count() == 4
    failed = page.locator("#entities-table tr[data-url='/broken/b1']")
    assert await failed.locator(".status-failed").inner_text() == "failed"
    assert "boom" in await failed.inner_text() and "2 input(s)" in await failed.inner_text()
    await shot(page, "entities")
    # The status filter: only the failed one.
    await page.select_option("#filter-status", "failed")
    await page.click("#filter-apply")
    await page.wait_for_function("() => location.hash === '#entities?status=failed'")
    await page.wait_for_function(
        "() => document.querySelectorAll('#entities-table tbody tr').length === 1"
    )
    assert await rows.first.get_attribute("data-url") == "/broken/b1"
    # A search by id, across types.
    await page.select_option("#filter-status", "")
    await page.fill("#filter-q", "n2")
    await page.click("#filter-apply")
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#entities-table tbody tr')]"
        ".map(r => r.dataset.url).join() === '/notes/n2'"
    )
    await page.fill("#filter-q", "nothing-like-this")
    await page.click("#filter-apply")
    await page.locator("#entities-empty").wait_for()
    # Pages from the server: two a page, "More" for the next.
    await page.goto(f"{base}/console/#entities?limit=2")
    await page.reload()
    await page.locator("#entities-table tr[data-url='/notes/n1']").wait_for()
    assert await rows.count() == 2
    await page.click("#entities-more")
    await page.locator("#entities-table tr[data-url='/tree/t1']").wait_for()
    assert await rows.count() == 4
    # A row opens its entity.
    await page.click("#entities-table a:text-is('/notes/n2')")
    await page.wait_for_selector("#entity-title[data-connection=live]")
    assert (await page.locator("#entity-title").inner_text()).startswith("/notes/n2")


async def test_a_user_lists_only_their_entities(cluster):
    rt = await cluster.runtime(ops_registry())
    app = create_app(rt, authenticate=bearer_tokens({"t-ann": {"user": "ann"}}))
    await rt.send("/notes/nobodys", "add x")  # no owner: out of reach of token holders
    await rt.wait_idle("/notes/nobodys")
    async with serving(app) as base, browser_page() as page:
        await page.goto(f"{base}/console/#entities")
        await page.locator("#error", has_text="Enter a bearer token").wait_for()
        await page.fill("#token", "t-ann")
        await page.dispatch_event("#token", "change")
        await page.fill("#entity-id", "hers")
        await page.select_option("#entity-type", "notes")
        await page.click("#open")  # creates /notes/hers, owned by ann
        await page.wait_for_selector("#entity-title[data-connection=live]")
        await page.click("#nav-entities")
        await page.locator("#entities-table tr[data-url='/notes/hers']").wait_for()
        assert await page.locator("#entities-table tbody tr").count() == 1


# -- workers ----------------------------------------------------------------------------


async def test_workers_view_and_the_banner_when_no_worker_serves_the_entity(cluster, shot):
    rt = await cluster.runtime(ops_registry(), run_worker=False)
    await rt.send("/notes/w1", "add milk")
    async with serving(create_app(rt)) as base, browser_page() as page:
        await opened(page, base, "/notes/w1")
        banner = page.locator("#partition-notice", has_text="No worker is running")
        await banner.wait_for()
        assert "/notes/w1" in await banner.inner_text()
        await page.locator("#status dd", has_text="no live worker").wait_for()
        await shot(page, "entity-no-worker")
        await page.click("#nav-workers")
        await page.locator("#workers-summary", has_text="0 live worker(s)").wait_for()
        assert await page.locator("#partitions span.unserved").count() == rt.settings.partitions
        await shot(page, "workers-none")
        worker = await cluster.runtime(ops_registry())  # takes every partition
        await worker.wait_idle("/notes/w1")
        [live] = await worker.workers()
        row = page.locator(f"#workers-table tr[data-worker='{live.id}']")
        await row.wait_for()  # the view polls
        await page.wait_for_function("() => !document.querySelector('#partitions .unserved')")
        assert "0, 1, 2, 3" in await row.inner_text()
        await shot(page, "workers")
        await page.go_back()
        await page.wait_for_function("() => document.querySelector('#partition-notice').hidden")
        await page.locator("#status .status-idle").wait_for()


# -- an entity's journal ----------------------------------------------------------------


async def test_the_journal_shows_each_event_retries_and_the_parked_state(ops, page, shot):
    base, rt = ops
    await rt.send("/broken/j1", "go")
    await rt.wait_idle("/broken/j1")
    await opened(page, base, "/broken/j1", "journal")
    rows = page.locator("#journal tbody tr")
    await page.locator("#journal tr[data-kind=failed]").wait_for()
    kinds = [await r.get_attribute("data-kind") for r in await rows.all()]
    assert kinds[:4] == ["created", "msg", "handler_error", "handler_error"] and "failed" in kinds
    retry = page.locator("#journal tr[data-kind=handler_error]").first
    text = await retry.inner_text()
    assert "attempt 1 failed: RuntimeError: boom" in text and "traceback withheld" in text
    assert await retry.get_attribute("class") == "bad"
    assert re.search(r"\d\d:\d\d:\d\d\.\d\d\d", await retry.locator(".time").inner_text())
    await page.locator("#journal-parked", has_text="Parked (failed) after 2 attempt(s)").wait_for()
    assert "wakeful tail" in await page.locator("#journal-note").inner_text()
    # The decoded event under its line.
    await retry.locator("summary").click()
    assert '"error_type": "RuntimeError"' in await retry.locator("pre").inner_text()
    assert '"traceback": ""' in await retry.locator("pre").inner_text()
    await shot(page, "journal")
    # Errors only.
    await page.check("#journal-errors")
    await page.wait_for_function(
        "() => getComputedStyle(document.querySelector('#journal tr[data-kind=msg]')).display"
        " === 'none'"
    )
    assert await page.locator("#journal tr[data-kind=failed]").is_visible()


async def test_the_journal_follows_new_events(ops, page):
    base, rt = ops
    await rt.send("/notes/live", "add milk")
    await rt.wait_idle("/notes/live")
    await opened(page, base, "/notes/live", "journal")
    await page.locator("#journal tr[data-kind=msg]").wait_for()
    await rt.send("/notes/live", "add eggs")
    await page.locator("#journal tr[data-kind=msg]", has_text="add eggs").wait_for()
    assert await page.locator("#journal tr[data-kind=msg]", has_text="add milk").count() == 1


async def test_the_journal_marks_trimmed_history(cluster, shot):
    rt = await cluster.runtime(ops_registry(), snapshot_every=1, retention_s=0, retention_entries=0)
    for text in ("a", "b", "c"):
        await rt.send("/notes/t1", f"add {text}")
        await rt.wait_idle("/notes/t1")
    async with serving(create_app(rt)) as base, browser_page() as page:
        await opened(page, base, "/notes/t1", "journal")
        first = page.locator("#journal tbody tr").first
        await first.wait_for()
        assert await first.get_attribute("data-kind") == "trimmed"
        assert "trimmed from Redis by log retention" in await first.inner_text()
        await shot(page, "journal-trimmed")


# -- the tree of children ---------------------------------------------------------------


async def test_the_tree_shows_every_level_with_each_status(ops, page, shot):
    base, rt = ops
    await rt.send("/tree/root", "2")
    await rt.wait_all_idle()
    await opened(page, base, "/tree/root", "tree")
    leaf = page.locator("#tree li[data-url='/tree/root.1.0']")
    await leaf.wait_for()
    # Nested: root > root.1 > root.1.0, each with its status and its last run.
    path = page.locator(
        "#tree li[data-url='/tree/root'] > ul > li[data-url='/tree/root.1'] > ul > "
        "li[data-url='/tree/root.1.0']"
    )
    assert await path.count() == 1
    assert await leaf.locator(".entity-status").inner_text() == "idle"
    assert "run completed: depth 0" in await leaf.locator(".detail").inner_text()
    assert await page.locator("#tree li").count() == 7
    await shot(page, "tree")
    await leaf.locator("a").click()
    await page.wait_for_selector("#entity-title:has-text('/tree/root.1.0')")


# -- resume, cancel, delete -------------------------------------------------------------


async def test_resume_a_failed_entity_with_its_button(ops, page, shot):
    base, rt = ops
    await rt.send("/flaky/f1", "job")
    assert (await rt.wait_idle("/flaky/f1")).status == "failed"
    await opened(page, base, "/flaky/f1")
    resume = page.locator("#resume:enabled")
    await resume.wait_for()
    FLAKY["failing"] = False
    await resume.click()
    await shot(page, "confirm-resume")
    await confirm(page, yes=False)  # kept: nothing happens
    assert (await rt.status("/flaky/f1")).status == "failed"
    await resume.click()
    await confirm(page)
    await page.locator(".note", has_text="resumed /flaky/f1: its inputs are retried").wait_for()
    await page.locator("#status .status-idle").wait_for()
    await page.locator("#resume:disabled").wait_for()
    assert (await rt.status("/flaky/f1")).status == "idle"
    finished = [r.event async for r in rt.events("/flaky/f1") if isinstance(r.event, RunFinished)]
    assert finished[-1].status == "completed" and finished[-1].response == "done job"
    # Resume skipping the inputs it failed on: the page lists them.
    FLAKY["failing"] = True
    await rt.send("/flaky/f2", "job")
    assert (await rt.wait_idle("/flaky/f2")).status == "failed"
    await opened(page, base, "/flaky/f2")
    await page.locator("#resume:enabled").click()
    await page.check("#confirm-check")
    await confirm(page)
    skipped = page.locator(".note", has_text="resumed /flaky/f2, skipping the input(s)")
    await skipped.wait_for()
    await page.locator("#status .status-idle").wait_for()
    assert (await rt.status("/flaky/f2")).status == "idle"


async def test_cancel_is_enabled_only_while_a_run_runs(ops, page):
    base, rt = ops
    await rt.ask("/assistant/c1", "remember that my city is Lyon")
    await opened(page, base, "/assistant/c1")
    await page.locator("#status .status-idle").wait_for()
    assert await page.locator("#cancel-run").is_disabled()  # no run
    await page.fill("#input", "forget my city")
    await page.press("#input", "Enter")
    await page.locator("#status .status-suspended").wait_for()  # the run waits for approval
    await page.locator("#cancel-run:enabled").click()
    await confirm(page)
    await page.locator(".note.bad", has_text="run cancelled").wait_for()
    await page.locator("#cancel-run:disabled").wait_for()
    status = await rt.wait_idle("/assistant/c1")
    assert status.status == "idle" and status.pending_actions == 0


async def test_delete_with_its_button_and_refusals_shown(cluster, shot):
    def readers_read(request: Any) -> bool:
        return request.access == "read" or (request.identity or {}).get("user") == "owner"

    rt = await cluster.runtime(ops_registry())
    await rt.send("/notes/d1", "add milk")
    await rt.wait_idle("/notes/d1")
    tokens = {"r-token": {"user": "reader"}, "o-token": {"user": "owner"}}
    app = create_app(rt, authenticate=bearer_tokens(tokens), authorize=readers_read)
    async with serving(app) as base, browser_page() as page:
        await page.goto(f"{base}/console/")
        await page.fill("#token", "r-token")
        await page.dispatch_event("#token", "change")
        await opened(page, base, "/notes/d1")
        await page.locator("#delete:enabled").click()
        await confirm(page)
        await page.locator("#error", has_text="403").wait_for()
        assert "not allowed to write /notes/d1" in await page.locator("#error").inner_text()
        await shot(page, "delete-refused")
        await page.fill("#token", "o-token")
        await page.dispatch_event("#token", "change")
        await page.locator("#delete:enabled").click()
        await confirm(page)
        await page.locator("#entity-title", has_text="/notes/d1 was deleted.").wait_for()
        assert await page.locator("#delete").is_disabled()
    with pytest.raises(EntityNotFoundError):
        await rt.status("/notes/d1")


# -- the rough edges of the old page ----------------------------------------------------


async def test_the_id_field_checks_the_ids_urls_py_allows(ops, page):
    base, _ = ops
    logged: list[str] = []
    page.on("console", lambda message: logged.append(message.text))
    await goto(page, f"{base}/console/")
    samples = ["alice", "a:b@c-d.e~f_g", "9lives", "-x", ".x", "a b", "a/b", "é", "x" * 201]
    valid = await page.evaluate(
        """(samples) => samples.map((s) => {
            const input = document.querySelector('#entity-id');
            input.value = s;
            return input.validity.valid;
        })""",
        samples,
    )
    expected = [re.fullmatch(ID_PATTERN, s) is not None and len(s) <= 200 for s in samples]
    assert expected[:3] == [True, True, True] and not any(expected[3:])
    assert valid[:-1] == expected[:-1]  # a value set by script is not held to maxlength
    assert not [m for m in logged if "pattern" in m.lower()]  # Chromium compiled it


async def test_a_bad_id_leaves_no_stale_title_or_loading(ops, page):
    base, rt = ops
    await rt.send("/notes/good", "add milk")
    await opened(page, base, "/notes/good")
    await page.evaluate("() => { location.hash = '#/notes/bad id'; }")
    await page.locator("#error", has_text="Not an entity id").wait_for()
    assert await page.locator("#entity-title").inner_text() == "No entity open."
    assert await page.locator("#status").inner_text() == "entity\nnone open"
    assert await page.title() == "Wakeful console"
    # A type the server does not know: its error, not a prompt to create it.
    await page.evaluate("() => { location.hash = '#/nope/x'; }")
    await page.locator("#error", has_text='Unknown entity type: "nope"').wait_for()
    assert await page.locator("#missing").count() == 0
    assert await page.locator("#entity-title").inner_text() == "No entity open."
    # The form refuses a bad id before any request, and says why.
    await page.fill("#entity-id", "bad/id")
    await page.click("#open")
    await page.locator("#error", has_text='Not an entity id: "bad/id"').wait_for()


async def test_the_children_table_stays_inside_the_sidebar(ops, page, shot):
    base, rt = ops
    await rt.send("/wide/w1", "go")
    await rt.wait_all_idle()
    await opened(page, base, "/wide/w1")
    await page.locator("#children table .status-completed").wait_for()
    # Measured in one step in the page: the console redraws the table at each refresh
    # (a new element), so a table found first and measured after may be gone by then
    # (Playwright's bounding_box of a detached element is None; it failed once so).
    table_right, aside_right = await page.evaluate(
        """() => [document.querySelector('#children table').getBoundingClientRect().right,
                  document.querySelector('aside').getBoundingClientRect().right]"""
    )
    assert table_right <= aside_right
    await page.locator("#children").scroll_into_view_if_needed()
    await shot(page, "children-sidebar")
    wider = await page.evaluate(
        """() => [...document.querySelectorAll('aside *')]
            .filter((el) => el.getBoundingClientRect().right > innerWidth + 0.5)
            .map((el) => el.tagName + '#' + el.id + '.' + el.className)"""
    )
    assert wider == []


async def test_a_420_px_window_keeps_the_chat_readable_and_open_on_screen(ops, page, shot):
    base, rt = ops
    await page.set_viewport_size({"width": 420, "height": 800})
    await rt.ask("/assistant/narrow", "remember that my color is teal")
    await opened(page, base, "/assistant/narrow")
    await page.locator(".bubble.agent", has_text="your color is teal").wait_for()
    open_button = await page.locator("#open").bounding_box()
    assert open_button["x"] >= 0 and open_button["x"] + open_button["width"] <= 420
    messages = await page.locator("#messages").bounding_box()
    assert messages["width"] >= 300  # the chat takes the width, the sidebar goes below
    page_width = await page.evaluate("() => document.documentElement.scrollWidth")
    assert page_width <= 420
    await shot(page, "chat-420")
    for view, name in [("#entities", "entities-420"), ("#workers", "workers-420")]:
        await page.goto(f"{base}/console/{view}")
        await page.wait_for_selector(f"{view}-view:not([hidden])")
        await page.wait_for_function("() => document.documentElement.scrollWidth <= 420")
        await shot(page, name)
    await opened(page, base, "/assistant/narrow", "journal")
    await page.locator("#journal tr[data-kind=run_finished]").wait_for()
    assert await page.evaluate("() => document.documentElement.scrollWidth") <= 420
    await shot(page, "journal-420")


async def test_the_sidebar_lists_entities_of_the_open_entitys_type(ops, page):
    base, rt = ops
    await rt.send("/notes/other", "add milk")
    await rt.ask("/assistant/bob", "remember that my color is teal")
    await opened(page, base, "/assistant/bob")
    await page.locator("#entities a", has_text="/assistant/bob").wait_for()
    await page.select_option("#entity-type", "notes")  # about to open another type
    await page.locator("#entities-heading", has_text="assistant").wait_for()
    links = await page.locator("#entities a").all_inner_texts()
    assert links and all(link.startswith("/assistant/") for link in links)
