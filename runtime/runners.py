"""Per-entity runners: one writer per entity, at most ``max_concurrency`` wakes at once.

Wake pointers read from the inboxes (or swept from them) are tracked per
partition and handed to the entity's :class:`Runner`, which runs the entity's
activations one at a time (single writer) through the wake pipeline. Every
runner is a task of the worker's runner task group (an ``asyncio.TaskGroup``:
a runner starts per busy entity, and anyio's ``start_soon`` costs five times
``create_task``), so none outlives the worker. A runner's own failures are
handled per entity: a retry waits and goes again, a fenced or interrupted wake
gives its pointers up, and a bug in the runtime (or metadata it cannot read) is
logged and parks the entity with the error in its status; if even that fails,
the pointers stay pending for a later sweep.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio

from . import metrics
from .cache import WarmCache
from .config import Settings
from .errors import FencedError
from .failures import RetryLater
from .store import TRANSIENT_ERRORS, EntityGoneError, Pointer, Preloaded
from .ticket import CancelSlot, WakeTicket

log = logging.getLogger("wakeful.runners")

STOP_WARNING_S = 5.0
"""How long a shutdown cancels runners before it names the ones that do not stop."""


class Slots:
    """At most ``n`` holders at once, first come first served, in O(1) per acquire and
    release: a busy worker has hundreds of runners waiting for a slot, and on Python
    3.11 ``asyncio.Semaphore`` scans its waiters at each release (it was among the top
    entries of the profile of one-message wakes).

    A holder either waits (:meth:`acquire`) or is started holding a slot
    (:meth:`start`): a runner's first activation does not exist as a task until its
    slot is free, so a read of hundreds of pointers does not make hundreds of tasks
    that each run, park on a future and are woken again."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiters: deque[asyncio.Future[None] | Callable[[], bool]] = deque()

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted, then cancelled
                self.release()
            raise

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def start(self, begin: Callable[[], bool]) -> None:
        """Call ``begin`` holding a slot: now if one is free, else when one is handed on,
        in turn with the waiters. ``begin`` returns whether it took the slot (then the
        slot is its to :meth:`release`; if not, it goes on at once); it must not raise."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            if not begin():
                self.release()
        else:
            self._waiters.append(begin)

    def decline_starts(self) -> None:
        """Call every ``begin`` still queued now, without a slot: each must decline."""
        starts = [w for w in self._waiters if not isinstance(w, asyncio.Future)]
        self._waiters = deque(w for w in self._waiters if isinstance(w, asyncio.Future))
        for begin in starts:
            taken = begin()
            assert not taken, "a start given no slot took one"

    def release(self) -> None:
        """Hand the slot to the first waiter still waiting (a loop, not a recursion: the
        starts that decline pass it on), or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not isinstance(waiter, asyncio.Future):
                if waiter():
                    return
            elif not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


@dataclass(frozen=True, slots=True)
class ReadMark:
    """A read of wake pointers in flight (the inbox read, or a delivery's send that
    reads): when it was sent (on the runners' clock), and the lease tokens it was made
    under. What it brings along for an entity is as good as a load
    only if no activation of the entity started or ended here since ``seq``, and only
    under the lease it was read under (see :meth:`Runners.schedule`)."""

    seq: int
    tokens: dict[int, str | None]


_TOUCHED_KEPT = 4096  # entries of Runners._touched kept before a prune is tried


@dataclass
class Runner:
    """Runs the activations of one entity, one at a time."""

    url: str
    partition: int
    pointer_ids: list[str] = field(default_factory=list)  # collected for the next activation
    cancels: CancelSlot = field(default_factory=CancelSlot)  # holds the current wake's signal
    task: asyncio.Task[None] | None = None  # None until a slot is free for its first wake
    holds_slot: bool = False  # started holding a slot, for its first activation
    # what the read (the inbox's, or a send's) brought with the pointer that started the
    # runner: its id, it, and the lease token the read was made under
    preload: tuple[str, Preloaded, str] | None = None


class Runners:
    """The runners of one worker; also what its :class:`~wakeful.leases.LeaseKeeper` serves."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        cache: WarmCache,
        stats: dict[str, int],
        token: Callable[[int], str | None],
        activate: Callable[[WakeTicket], Awaitable[None]],
        crashed: Callable[[WakeTicket, Exception], Awaitable[None]],
    ) -> None:
        self.worker_id = worker_id
        self.cache = cache
        self.stats = stats
        self._token = token
        self._activate = activate
        self._crashed = crashed
        self._runners: dict[str, Runner] = {}
        self._tracked: dict[int, set[str]] = {}  # pointer ids taken per partition
        # When an activation of each entity last started or ended here (the runners'
        # clock): what a read sent before that brought along may predate its commits.
        # Several reads can be in flight (the inbox read, and the reads deliveries make
        # with their sends), each with its own mark; entries older than every read in
        # flight tell nothing and are pruned.
        self._clock = 0
        self._touched: dict[str, int] = {}
        self._reads: dict[int, int] = {}  # the marks in flight: seq -> how many reads
        self._prune_at = _TOUCHED_KEPT
        self._stranded: set[int] = set()  # partitions whose pointers a wake left pending
        self._slots = Slots(settings.max_concurrency)
        self._group: asyncio.TaskGroup | None = None
        self.killed = False
        self.room = asyncio.Event()  # set when pointers are done with (the backlog shrank)
        self.idle = asyncio.Event()  # set while no runner runs
        self.idle.set()

    # -- the task group ------------------------------------------------------------

    def open(self, group: asyncio.TaskGroup) -> None:
        """Start runners in ``group`` from now on."""
        self._group = group

    def close(self) -> None:
        """Start no more runners: pointers scheduled from now on stay pending, and so do
        those of the runners still waiting for a slot (they end now)."""
        self._group = None
        self._slots.decline_starts()

    def own(self, func: Callable[..., Coroutine[Any, Any, None]], *args: Any, name: str) -> None:
        """Run background work of the runners (a capability cleanup) in their group."""
        if self._group is not None:
            self._group.create_task(func(*args), name=name)

    async def drain(self, grace: float) -> None:
        """Let running activations finish; after ``grace`` seconds, signal them to stop."""
        with anyio.move_on_after(grace):
            await self.idle.wait()
        for runner in list(self._runners.values()):
            runner.cancels.signal.cancel("worker shutting down", kind="shutdown")

    async def stop_all(self) -> None:
        """Cancel the runners still running, until every one has ended.

        Cancel again until each ends: on Python 3.11 a cancellation can be swallowed
        by an ``asyncio.wait_for`` inside redis-py (it sends with one when
        ``socket_timeout`` is set), and a runner that survived a single cancel would
        hang the shutdown."""
        deadline = asyncio.get_running_loop().time() + STOP_WARNING_S
        while pending := [r.task for r in self._runners.values() if r.task and not r.task.done()]:
            if deadline and asyncio.get_running_loop().time() >= deadline:
                # A handler that swallows cancellation: the runner group owns its task and
                # waits for it, so say which ones hold the shutdown up (and keep cancelling).
                names = ", ".join(sorted(t.get_name() for t in pending))
                log.error(
                    "worker %s: still cancelling runners that do not stop: %s",
                    self.worker_id,
                    names,
                )
                deadline = 0.0
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=0.1)

    # -- what the lease keeper and the listeners call -------------------------------

    def adopt(self, partition: int) -> None:
        self._tracked.setdefault(partition, set())

    def abandon(self, partition: int, reason: str) -> None:
        self._tracked.pop(partition, None)
        for runner in self._runners.values():
            if runner.partition == partition:
                runner.cancels.signal.cancel(reason, kind="lease")
                runner.pointer_ids.clear()

    def busy(self, partition: int) -> bool:
        return any(r.partition == partition for r in self._runners.values())

    def running(self, url: str) -> bool:
        return url in self._runners

    def cancel(self, url: str, reason: str) -> None:
        """A client cancelled ``url``'s run: tell its wake, if it runs here."""
        # A preload read before this request lacks its input, and the signal set now is
        # replaced when the wake arms its own: the wake must load (and see the input).
        self._touch(url)
        runner = self._runners.get(url)
        if runner is not None:
            runner.preload = None
            runner.cancels.signal.cancel(reason, kind="cancel")

    def backlog(self) -> int:
        return sum(len(t) for t in self._tracked.values())

    def reading(self, partitions: list[int]) -> ReadMark:
        """A read of ``partitions``' pointers is sent now: what it brings along is fresh for
        every entity no activation here touches until it returns, while the lease it was
        read under is held (see :meth:`schedule`). Pass the mark to :meth:`schedule`
        with what the read brought, and then to :meth:`read_done`."""
        mark = ReadMark(self._clock, {p: self._token(p) for p in partitions})
        self._reads[mark.seq] = self._reads.get(mark.seq, 0) + 1
        return mark

    def read_done(self, mark: ReadMark) -> None:
        """The read of ``mark`` returned (or failed) and its pointers are scheduled."""
        left = self._reads.pop(mark.seq) - 1
        if left:
            self._reads[mark.seq] = left
        if len(self._touched) > self._prune_at:
            oldest = min(self._reads, default=self._clock)
            self._touched = {u: t for u, t in self._touched.items() if t > oldest}
            self._prune_at = max(_TOUCHED_KEPT, 2 * len(self._touched))

    def _touch(self, url: str) -> None:
        self._clock += 1
        self._touched[url] = self._clock

    def _fresh(self, pointer: Pointer, mark: ReadMark | None) -> str | None:
        """The lease token under which ``pointer``'s preload is as good as a load, or
        None: only if no activation of the entity started or ended here since the read
        was sent (its commits would be missing from it), and only under the lease it was
        read under (with a lease lost and taken again, another owner may have committed
        in between)."""
        if pointer.preload is None or mark is None:
            return None
        if self._touched.get(pointer.url, -1) > mark.seq:
            return None
        return mark.tokens.get(pointer.partition)

    def schedule(self, pointer: Pointer, mark: ReadMark | None = None) -> None:
        """Hand ``pointer`` to its entity's runner (starting one); ``mark`` is the read
        it came from, if that read brought a preload along."""
        tracked = self._tracked.get(pointer.partition)
        if tracked is None or pointer.entry_id in tracked or self._group is None:
            return
        tracked.add(pointer.entry_id)
        runner = self._runners.get(pointer.url)
        if runner is None:
            runner = self._runners[pointer.url] = Runner(pointer.url, pointer.partition)
            read_under = self._fresh(pointer, mark)
            if read_under is not None:
                assert pointer.preload is not None
                runner.preload = (pointer.entry_id, pointer.preload, read_under)
            self.idle.clear()
            self._slots.start(functools.partial(self._begin, runner))
        else:  # a wake of it runs: the read may predate that wake's commit
            runner.preload = None
        runner.pointer_ids.append(pointer.entry_id)

    def strand(self, partition: int) -> None:
        """Pointers of ``partition`` may be pending here unscheduled (a read whose
        reply was lost): the lease keeper sweeps them a lease period later."""
        self._stranded.add(partition)

    def stranded(self) -> set[int]:
        """The partitions whose pointers a wake gave up on unacknowledged since the last
        call (the lease keeper sweeps them a lease period later)."""
        stranded, self._stranded = self._stranded, set()
        return stranded

    def tracked(self, partition: int) -> int:
        return len(self._tracked.get(partition, ()))

    def untrack(self, partition: int, pointer_ids: list[str]) -> None:
        tracked = self._tracked.get(partition)
        if tracked is not None:
            tracked.difference_update(pointer_ids)
        self.room.set()

    def done(self, ticket: WakeTicket) -> None:
        """The ticket's pointers are acknowledged (or given up to another owner)."""
        self.untrack(ticket.partition, ticket.pointer_ids)

    # -- one entity's activations ------------------------------------------------------

    def _begin(self, runner: Runner) -> bool:
        """A slot is free for ``runner``'s first activation: start its task, which
        releases the slot when that activation ends. Declined (False) once the runners
        are closed: the runner ends, its pointers pending."""
        group = self._group
        try:
            if group is None:
                raise RuntimeError("the runners are closed")
            task = group.create_task(self._run_entity(runner), name=f"wake {runner.url}")
        except RuntimeError:  # closed, or its task group is shutting down
            self._end(runner)
            return False
        runner.task = task
        runner.holds_slot = True
        task.add_done_callback(functools.partial(self._unstarted, runner))
        return True

    def _unstarted(self, runner: Runner, task: asyncio.Task[None]) -> None:
        """A runner's task ended: if it was cancelled before its first step (a stopping
        worker), none of its code ran, so its slot and its place are given up here."""
        if runner.holds_slot:
            self._give_slot_back(runner)
            self._end(runner)

    def _give_slot_back(self, runner: Runner) -> None:
        """Release the slot ``runner`` was started with, if no activation took it."""
        if runner.holds_slot:
            runner.holds_slot = False
            self._slots.release()

    async def _run_entity(self, runner: Runner) -> None:
        try:
            while runner.pointer_ids and self._token(runner.partition) is not None:
                pointer_ids, runner.pointer_ids = runner.pointer_ids, []
                await self._attempt(runner, pointer_ids)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            if not self.killed:  # after kill() the task just ends, whatever stopped it
                raise
        except BaseException:  # a bug in the runtime itself: this entity only, pointers pending
            log.exception("worker %s: runner of %s crashed", self.worker_id, runner.url)
            self.cache.forget(runner.url)
        finally:
            self._give_slot_back(runner)  # ended before its first activation took it
            self._end(runner)

    def _end(self, runner: Runner) -> None:
        """``runner`` is done: what it still holds stays pending (the lease keeper
        sweeps it later)."""
        if runner.pointer_ids:
            self._stranded.add(runner.partition)
        # Parking a crashed wake commits after the attempt's own mark: a read sent
        # before it must not bring back what it replaced.
        self._touch(runner.url)
        self.untrack(runner.partition, runner.pointer_ids)
        self._runners.pop(runner.url, None)
        if not self._runners:
            self.idle.set()

    async def _attempt(self, runner: Runner, pointer_ids: list[str]) -> None:
        """One activation of ``runner``'s entity; decides what happens to the pointers."""
        url = runner.url
        try:
            held, runner.holds_slot = runner.holds_slot, False
            if not held:
                await self._slots.acquire()
            try:
                # Taken once the slot is held: a cancel heard while waiting drops it.
                preload, runner.preload = runner.preload, None
                token = self._token(runner.partition)
                if token is None:
                    runner.pointer_ids[:0] = pointer_ids  # pending, untracked when it ends
                    return
                runner.cancels.lease_valid = lambda: self._token(runner.partition) == token
                ticket = WakeTicket(
                    url,
                    runner.partition,
                    token,
                    pointer_ids,
                    runner.cancels,
                    preload=(
                        preload[1]
                        if preload and pointer_ids == [preload[0]] and token == preload[2]
                        else None
                    ),
                )
                self._touch(url)
                try:
                    with metrics.wake(pointer_ids):
                        await self._activate(ticket)
                finally:
                    self._touch(url)
                if runner.cancels.signal.kind == "lease":
                    # Stopped on a lapsed lease, the wake gave its pointers up
                    # unacknowledged. If the lease is renewed rather than taken over (it
                    # lapsed here only), no acquisition claims them: sweep them here.
                    self._stranded.add(runner.partition)
            finally:
                self._slots.release()
        except RetryLater as retry:
            runner.pointer_ids[:0] = pointer_ids  # keep them (unacked) for the next attempt
            await self._sleep_or_lose(runner, retry.delay)
        except EntityGoneError:  # deleted or re-created meanwhile: look again
            self.cache.forget(url)
            runner.pointer_ids[:0] = pointer_ids
        except FencedError as exc:
            self.stats["commits_fenced"] += 1
            log.warning("worker %s: %s", self.worker_id, exc)
            self.cache.forget(url)
            self.untrack(runner.partition, pointer_ids)
        except TRANSIENT_ERRORS as exc:
            log.warning("worker %s: wake of %s interrupted: %s", self.worker_id, url, exc)
            self.cache.forget(url)
            runner.pointer_ids[:0] = pointer_ids
            await self._sleep_or_lose(runner, 0.5)
        except Exception as exc:  # a bug in the runtime, or metadata it cannot read
            log.exception("worker %s: the wake of %s failed in the runtime", self.worker_id, url)
            await self._park_crashed(runner, pointer_ids, exc)

    async def _park_crashed(self, runner: Runner, pointer_ids: list[str], exc: Exception) -> None:
        """Park the entity with the error; if that fails too, leave its pointers pending
        (untracked), so the sweep retries it a lease period later."""
        self.cache.forget(runner.url)
        token = self._token(runner.partition)
        try:
            if token is not None:
                ticket = WakeTicket(
                    runner.url, runner.partition, token, pointer_ids, runner.cancels
                )
                await self._crashed(ticket, exc)
                return
        except Exception:
            log.exception("worker %s: parking %s failed", self.worker_id, runner.url)
        self._stranded.add(runner.partition)
        self.untrack(runner.partition, pointer_ids)

    async def _sleep_or_lose(self, runner: Runner, delay: float) -> None:
        with anyio.move_on_after(delay):
            await runner.cancels.signal.wait()
