#!/usr/bin/env python
"""Overhead of the agent loop per step, with a scripted model that answers at once,
next to the raw redis-py consume loop measured in the same run.

    .venv/bin/python scripts/bench_agent.py             # full size (under a minute)
    .venv/bin/python scripts/bench_agent.py --quick     # smoke run, a few seconds

The issue: "The runtime's overhead per agent step with a ScriptedModel that
answers at once (steps per second per worker, and ms added per step), printed
beside the foundation benchmark's raw baseline."

**The agent.** An ``agent`` entity's handler does ``ctx.use_agent(system_prompt=...,
model=ScriptedModel(fn), tools=[echo])`` and ``await ctx.agent.run()``. ``fn``
answers at once: ``--tool-steps`` responses that each call the trivial ``echo``
tool, then a text that ends the turn, so a run has ``tool-steps + 1`` model steps
and ``tool-steps`` tool calls (default 2 steps + 1 tool call). Every journaled step
is committed (each assistant step with its calls' tool intents, the first one with the
user turn too; each tool result; the last step and the run's end with the wake's own
commit); the commits per step are counted at the store, and the time the run spends
awaiting them (``Store.commit``) is shown as part of the runtime's. The runtime's ms per step (low load, p50) and the
commits per step are printed with PASS or MISS against issue 19's targets (at most
0.5 ms and 2 commits a step).
Since the model costs nothing, everything a step takes is the runtime's.

**Low load: ms per step.** One entity, ``--seq-runs`` runs one after the other
(``rt.ask``; ``--warmup`` runs on another entity first). Reported per run, in the
worker: ``ctx.agent.run()`` wall time / steps (the ms the runtime adds per step),
and the client's ``rt.ask`` wall time / steps.

**Throughput: steps/s for one worker.** ``--entities`` entities, each asked
``--runs`` times in a row, all entities at once (``rt.ask`` from this process).
steps/s = model steps / wall time from the first send to the last answer. Also
the worker process's CPU time per step (``time.process_time`` in the worker), so
the worker's own cost is visible even when the client or Redis is the limit.

**Raw baseline.** The consume loop of ``bench_wakes.py`` / PERF-REFERENCE
(``benchlib.raw_consume``: XREADGROUP COUNT 100, decode, one pipeline of XADD per
message + XACK per stream), ONE consumer process draining ``--raw-messages``
preloaded messages: msgs/s and CPU us per message. Each raw message is one
handler call and one durable write, so the ratios printed are steps/s over raw
msgs/s and commits/s over raw msgs/s.

The worker runs in its own process (a real ``Worker`` and ``Store``, as in
``bench_wakes.py``), the client in this one; both share the machine with Redis.
Every key lives under a unique prefix (``wkagent-...``) and is deleted at the end.
``WAKEFUL_*`` variables tune the runtime; the worker inherits them.
Like the ``wakeful worker`` CLI, the worker settles its garbage collector once
started (``wakeful.heap``: start-up objects frozen, e.g. the anthropic SDK's ~170k
that otherwise make every full collection pause the worker for ~80 ms or more, and a
youngest generation of 50,000); ``--no-gc-freeze`` leaves that out, to compare. Full collections during each phase
are counted. ``--profile-worker FILE`` runs cProfile in the worker during one phase
(``--profile-phase seq|tp``) and prints its top functions to stderr. The last line of output is every
figure as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import itertools
import json
import os
import statistics
import sys
import time
from typing import Any

from benchlib import (
    STARTUP_TIMEOUT_S,
    Child,
    add_gc_freeze_argument,
    add_profiling_arguments,
    add_redis_argument,
    code_version,
    counting_redis,
    delete_prefix,
    describe_machine,
    emit,
    fmt,
    percentiles,
    print_profile,
    raw_consume,
    run_raw_throughput,
    unique_prefix,
)
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from wakeful import (
    AgentTool,
    HandlerContext,
    Registry,
    Runtime,
    ScriptedModel,
    Settings,
    ToolResult,
    Worker,
)
from wakeful.heap import settle_for_long_run
from wakeful.keys import Keyspace
from wakeful.models import ModelRequest, ModelResponse
from wakeful.store import Store

WARM = "/agent/warm"
SOLO = "/agent/solo"
CONTROL = "/control/c"

# -- the agent (runs in the worker process) -----------------------------------------------


class Group:
    """Figures of the runs of one group of entities (warm-up, sequential, throughput)."""

    def __init__(self) -> None:
        self.runs = 0
        self.steps = 0
        self.tool_calls = 0
        self.commits = 0
        self.run_s: list[float] = []  # ctx.agent.run() wall time per run
        self.per_step_s: list[float] = []  # run wall time / steps, per run
        self.model_per_step_s: list[float] = []  # of it, inside ScriptedModel.complete
        self.runtime_per_step_s: list[float] = []  # the rest: the runtime's
        self.commit_per_step_s: list[float] = []  # of it, awaiting Store.commit in the run
        self.commit_s = 0.0  # Store.commit wall time of the group's entities, so far
        self.first: tuple[float, float, int] | None = None  # perf, cpu, round trips
        self.last_end = 0.0

    def report(self, counter: Any) -> dict[str, Any]:
        t0, cpu0, rtt0 = self.first or (time.perf_counter(), time.process_time(), 0)
        steps = max(1, self.steps)
        series = self.runtime_per_step_s
        tenth = max(1, len(series) // 10)
        return {
            "runs": self.runs,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "commits": self.commits,
            "commits_per_step": self.commits / steps,
            "commits_per_run": self.commits / max(1, self.runs),
            "run": percentiles(self.run_s),
            "per_step": percentiles(self.per_step_s),
            "model_per_step": percentiles(self.model_per_step_s),
            "runtime_per_step": percentiles(series),
            "commit_per_step": percentiles(self.commit_per_step_s),
            "mean_per_step_ms": statistics.fmean(self.per_step_s) * 1000 if self.per_step_s else 0,
            # the runtime's ms per step over the first and the last tenth of the runs
            "runtime_per_step_first_ms": statistics.fmean(series[:tenth]) * 1000 if series else 0,
            "runtime_per_step_last_ms": statistics.fmean(series[-tenth:]) * 1000 if series else 0,
            "runtime_per_step_ms_series": [round(x * 1000, 3) for x in series],
            "busy_s": self.last_end - t0,
            "cpu_s": time.process_time() - cpu0,
            "cpu_ms_per_step": (time.process_time() - cpu0) / steps * 1000,
            "redis_round_trips_per_step": ((counter.n if counter else 0) - rtt0) / steps,
        }


class Probe:
    def __init__(self) -> None:
        self.tool_steps = 1
        self.counter: Any = None
        self.groups: dict[str, Group] = {}
        self.reports: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.gc_pauses: list[float] = []  # full (generation 2) collections in the worker
        self._gc_start = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_pauses.append(time.perf_counter() - self._gc_start)

    def gc_report(self) -> dict[str, Any]:
        pauses, self.gc_pauses = self.gc_pauses, []
        return {
            "full_collections": len(pauses),
            "total_ms": round(sum(pauses) * 1000, 1),
            "max_ms": round(max(pauses, default=0.0) * 1000, 1),
        }

    def group(self, url: str) -> Group:
        name = "warm" if url == WARM else "seq" if url == SOLO else "tp"
        if name not in self.groups:
            self.groups[name] = Group()
        return self.groups[name]


# issue 19's targets for an agent step: the runtime's ms per step and its commits
STEP_MS_TARGET = 0.5
STEP_COMMITS_TARGET = 2.0

PROBE = Probe()
registry = Registry()


def respond(request: ModelRequest) -> ModelResponse:
    """Answer at once: ``PROBE.tool_steps`` tool calls in a row, then a text."""
    rounds = 0
    for message in reversed(request.messages):
        if message["role"] != "user":
            continue
        if any(block.get("type") == "text" for block in message["content"]):
            break  # the user turn that opened this run
        rounds += 1  # a user message of tool results
    if rounds < PROBE.tool_steps:
        call = {
            "type": "tool_use",
            "id": f"t{len(request.messages)}",
            "name": "echo",
            "input": {"text": f"step {rounds + 1}"},
        }
        return ModelResponse(content=[call], stop_reason="tool_use")
    return ModelResponse(content=[{"type": "text", "text": "done"}], stop_reason="end_turn")


class TimedModel(ScriptedModel):
    """ScriptedModel, timing its own calls."""

    def __init__(self, script: Any) -> None:
        super().__init__(script)
        self.seconds = 0.0

    async def complete(self, request: ModelRequest, **options: Any) -> ModelResponse:
        t = time.perf_counter()
        try:
            return await super().complete(request, **options)
        finally:
            self.seconds += time.perf_counter() - t


async def echo(call_id: str, params: Any, signal: Any, on_update: Any) -> ToolResult:
    return ToolResult(params["text"])


ECHO = AgentTool(
    "echo",
    "Echoes its text.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    echo,
)


@registry.entity("agent", description="an agent with a scripted model and one trivial tool")
async def agent(ctx: HandlerContext) -> None:
    group = PROBE.group(ctx.entity_url)
    start = time.perf_counter()
    committing = group.commit_s
    if group.first is None:
        counter = PROBE.counter
        group.first = (start, time.process_time(), counter.n if counter else 0)
    model = TimedModel(respond)  # one per wake: ScriptedModel keeps every request
    ctx.use_agent(system_prompt="You are a benchmark agent.", model=model, tools=[ECHO])
    result = await ctx.agent.run()
    end = time.perf_counter()
    if result.run_id is None:
        return
    steps = max(1, result.steps)
    group.runs += 1
    group.steps += result.steps
    group.tool_calls += result.tool_calls
    group.run_s.append(end - start)
    group.per_step_s.append((end - start) / steps)
    group.model_per_step_s.append(model.seconds / steps)
    group.runtime_per_step_s.append((end - start - model.seconds) / steps)
    group.commit_per_step_s.append((group.commit_s - committing) / steps)
    group.last_end = end


@registry.entity("control", description="reports the worker's figures to the benchmark")
async def control(ctx: HandlerContext) -> None:
    for _ in ctx.wake.messages:
        report = {name: group.report(PROBE.counter) for name, group in PROBE.groups.items()}
        report["gc"] = PROBE.gc_report()
        PROBE.reports.put_nowait(report)
        ctx.reply("ok")


class BenchStore(Store):
    """The real store; counts the commits of each group of entities."""

    async def commit(self, url: str, token: str, **kwargs: Any) -> list[str]:
        start = time.perf_counter()
        result = await super().commit(url, token, **kwargs)
        if not url.startswith("/control/"):
            group = PROBE.group(url)
            group.commits += 1
            group.commit_s += time.perf_counter() - start
        return result


# -- the worker process ---------------------------------------------------------------------


def settings_for(args: argparse.Namespace, prefix: str) -> Settings:
    return Settings.from_env(redis_url=args.redis, prefix=prefix, partitions=args.partitions)


async def worker_main(args: argparse.Namespace) -> None:
    PROBE.tool_steps = args.tool_steps
    settings = settings_for(args, args.prefix)
    conn, PROBE.counter = counting_redis(args.redis)
    store = BenchStore(
        conn,
        Keyspace(settings.prefix, settings.partitions),
        idempotency_ttl_ms=settings.idempotency_ttl_s * 1000,
    )
    worker = Worker(registry, store, settings)
    task = asyncio.create_task(worker.run())
    ready = asyncio.create_task(worker.ready.wait())
    await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    if args.gc_freeze:  # as the `wakeful worker` CLI does
        settle_for_long_run()  # startup objects (the anthropic SDK, ...) leave the GC's scans
    gc.callbacks.append(PROBE.on_gc)
    emit(event="ready")
    profiler = cProfile.Profile() if args.profile else None
    try:
        for phase in ("seq", "tp"):
            if profiler is not None and phase == args.profile_phase:
                profiler.enable()
            report = await PROBE.reports.get()
            if profiler is not None and phase == args.profile_phase:
                profiler.disable()
            emit(event=phase, groups=report, worker_stats=dict(worker.stats))
    finally:
        if profiler is not None:
            profiler.dump_stats(args.profile)
        worker.stop()
        await task
        await conn.aclose()


# -- the client -------------------------------------------------------------------------------


async def run_agent(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    # rt.ask holds a pub/sub connection while it waits: one connection per entity asked
    # at once, more than redis-py's default pool of 100.
    conn, counter = counting_redis(args.redis, max_connections=args.entities * 2 + 50)
    rt = await Runtime(
        registry, settings=settings_for(args, prefix), run_worker=False, redis=conn
    ).start()
    child = await Child.start(
        __file__,
        "worker",
        args.redis,
        prefix,
        partitions=args.partitions,
        tool_steps=args.tool_steps,
        no_gc_freeze=not args.gc_freeze,
        profile=args.profile_worker,
        profile_phase=args.profile_phase,
    )
    try:
        await child.expect("ready", STARTUP_TIMEOUT_S)
        result: dict[str, Any] = {}

        async def ask(url: str, n: int) -> None:
            answer = await rt.ask(url, {"text": f"question {n}"}, timeout=120)
            if answer != "done":
                raise RuntimeError(f"{url} answered {answer!r}")

        # low load: one entity, one run at a time
        for n in range(args.warmup):
            await ask(WARM, n)
        asks: list[float] = []
        before = counter.n
        for n in range(args.seq_runs):
            t = time.perf_counter()
            await ask(SOLO, n)
            asks.append(time.perf_counter() - t)
        client_rtt = counter.n - before
        await rt.ask(CONTROL, "report", timeout=30)
        seq_event = (await child.expect("seq", 60))["groups"]
        seq = seq_event["seq"]
        seq["gc"] = seq_event["gc"]
        steps_per_run = seq["steps"] / max(1, seq["runs"])
        seq["ask"] = percentiles(asks)
        seq["ask_per_step"] = percentiles([a / steps_per_run for a in asks])
        seq["client_round_trips_per_step"] = client_rtt / max(1, seq["steps"])
        result["seq"] = seq

        # throughput: many entities, each asked several times in a row
        urls = [f"/agent/e{i:04d}" for i in range(args.entities)]

        async def entity_loop(url: str) -> None:
            for n in range(args.runs):
                await ask(url, n)

        before = counter.n
        t = time.perf_counter()
        await asyncio.gather(*(entity_loop(url) for url in urls))
        wall = time.perf_counter() - t
        client_rtt = counter.n - before
        await rt.ask(CONTROL, "report", timeout=30)
        tp_event = await child.expect("tp", 60)
        tp = tp_event["groups"]["tp"]
        tp["gc"] = tp_event["groups"]["gc"]
        tp["seconds"] = wall
        tp["steps_per_s"] = tp["steps"] / wall
        tp["runs_per_s"] = tp["runs"] / wall
        tp["commits_per_s"] = tp["commits"] / wall
        tp["client_round_trips_per_step"] = client_rtt / max(1, tp["steps"])
        tp["worker_stats"] = tp_event["worker_stats"]
        tp.pop("runtime_per_step_ms_series", None)
        result["tp"] = tp
        await child.finish()
        return result
    finally:
        child.kill()
        await rt.close()


# -- orchestration ------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> int:
    r = Redis.from_url(args.redis, decode_responses=False)
    machine = await describe_machine(r)
    machine["code"] = code_version()
    steps_per_run = args.tool_steps + 1
    print(
        f"workload: runs of {steps_per_run} model steps + {args.tool_steps} tool call(s), "
        f"scripted model answering at once; low load: 1 entity x {args.seq_runs} runs in a "
        f"row; throughput: {args.entities:,} entities x {args.runs} runs, all at once; raw "
        f"baseline: {args.raw_messages:,} messages; {args.partitions} partitions; runtime at "
        f"{machine['code']}" + ("" if args.gc_freeze else "; the worker's collector NOT settled"),
        flush=True,
    )
    base = unique_prefix("wkagent")
    try:
        raw = await run_raw_throughput(
            __file__,
            r,
            args.redis,
            f"{base}-r",
            partitions=args.partitions,
            entities=1000,
            messages=args.raw_messages,
        )
        print(f"  raw consume loop done: {fmt(raw['msgs_per_s'])} msgs/s", flush=True)
        wk = await run_agent(args, f"{base}-w")
    finally:
        for side in "rw":
            await delete_prefix(r, f"{base}-{side}")
        await r.aclose()

    seq, tp = wk["seq"], wk["tp"]
    raw_rate = raw["msgs_per_s"]
    print()
    print("one worker process; the client (rt.ask) in this process; Redis on the same machine")
    print(f"  {'':<52}{'per s':>10}{'CPU us each':>13}{'ratio to raw':>14}")
    print(
        f"  {'raw redis-py consume loop, msgs':<52}{fmt(raw_rate):>10}"
        f"{raw['cpu_us_per_msg']:>13.1f}{1:>14.3f}"
    )
    print(
        f"  {'wakeful agent steps (' + str(args.entities) + ' entities x ' + str(args.runs) + ' runs)':<52}"
        f"{fmt(tp['steps_per_s']):>10}{tp['cpu_ms_per_step'] * 1000:>13.0f}"
        f"{tp['steps_per_s'] / raw_rate:>14.4f}"
    )
    print(
        f"  {'  their commits (journaled steps + wake ends)':<52}{fmt(tp['commits_per_s']):>10}"
        f"{tp['cpu_ms_per_step'] * 1000 / tp['commits_per_step']:>13.0f}"
        f"{tp['commits_per_s'] / raw_rate:>14.4f}"
    )
    print(
        f"  {'  their runs':<52}{fmt(tp['runs_per_s']):>10}"
        f"{tp['cpu_ms_per_step'] * 1000 * tp['steps'] / max(1, tp['runs']):>13.0f}"
    )
    print(
        f"  {tp['steps']:,} steps, {tp['tool_calls']:,} tool calls, {tp['commits']:,} commits in "
        f"{tp['seconds']:.2f} s (worker busy {tp['busy_s']:.2f} s, worker CPU {tp['cpu_s']:.2f} s: "
        f"{tp['cpu_ms_per_step']:.2f} ms per step, so at most "
        f"{fmt(1000 / tp['cpu_ms_per_step'])} steps/s per worker core)"
    )
    print(
        f"  per step: {tp['commits_per_step']:.2f} commits ({tp['commits_per_run']:.1f} per run), "
        f"{tp['redis_round_trips_per_step']:.1f} Redis round trips in the worker, "
        f"{tp['client_round_trips_per_step']:.1f} in the client; worker full GCs "
        f"{tp['gc']['full_collections']} (max {tp['gc']['max_ms']:.1f} ms)"
    )
    print()
    print(
        f"low load: one entity, {args.seq_runs} runs in a row, in ms "
        f"(each run {steps_per_run} steps + {args.tool_steps} tool call(s))"
    )
    print(f"  {'':<50}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}")
    for label, q in (
        ("worker: ctx.agent.run() per step", seq["per_step"]),
        ("  of which ScriptedModel.complete", seq["model_per_step"]),
        ("  of which the runtime (the rest)", seq["runtime_per_step"]),
        ("    of which awaiting commits (Store.commit)", seq["commit_per_step"]),
        ("worker: ctx.agent.run() per run", seq["run"]),
        ("client: rt.ask per step", seq["ask_per_step"]),
        ("client: rt.ask per run", seq["ask"]),
    ):
        print(f"  {label:<50}{q['p50']:>8.2f}{q['p90']:>8.2f}{q['p99']:>8.2f}{q['max']:>8.2f}")
    print(
        f"  ms added per step by the runtime (worker, p50): {seq['runtime_per_step']['p50']:.2f} "
        f"ms; {seq['commits_per_step']:.2f} commits and "
        f"{seq['redis_round_trips_per_step']:.1f} Redis round trips per step; worker CPU "
        f"{seq['cpu_ms_per_step']:.2f} ms per step (raw loop: {raw['cpu_us_per_msg']:.1f} us "
        "per message)"
    )
    print(
        f"  the conversation grows run by run: the runtime's ms per step was "
        f"{seq['runtime_per_step_first_ms']:.2f} over the first tenth of the runs and "
        f"{seq['runtime_per_step_last_ms']:.2f} over the last; worker full GCs "
        f"{seq['gc']['full_collections']} (max {seq['gc']['max_ms']:.1f} ms)"
    )
    ms_step = seq["runtime_per_step"]["p50"]
    commits_step = tp["commits_per_step"]
    ms_ok = ms_step <= STEP_MS_TARGET
    commits_ok = commits_step <= STEP_COMMITS_TARGET
    print()
    print("targets (issue 19: agent step overhead), next to the raw loop of this run")
    print(
        f"  runtime ms per step (worker, low load, p50): {ms_step:.2f} ms, target <= "
        f"{STEP_MS_TARGET} ms: {'PASS' if ms_ok else 'MISS'} (ratio to target "
        f"{ms_step / STEP_MS_TARGET:.2f}; raw loop {raw['cpu_us_per_msg'] / 1000:.3f} ms per "
        f"message, so a step is {ms_step * 1000 / raw['cpu_us_per_msg']:.0f} raw messages)"
    )
    print(
        f"  commits per step: {commits_step:.2f} (low load {seq['commits_per_step']:.2f}), "
        f"target <= {STEP_COMMITS_TARGET}: {'PASS' if commits_ok else 'MISS'}"
    )
    print()
    print(
        json.dumps(
            {
                "machine": machine,
                "workload": {
                    "tool_steps": args.tool_steps,
                    "steps_per_run": steps_per_run,
                    "seq_runs": args.seq_runs,
                    "warmup": args.warmup,
                    "entities": args.entities,
                    "runs": args.runs,
                    "raw_messages": args.raw_messages,
                    "partitions": args.partitions,
                    "gc_freeze": args.gc_freeze,
                },
                "raw": raw,
                "throughput": tp,
                "low_load": seq,
                "headline": {
                    "raw_msgs_per_s": raw_rate,
                    "steps_per_s": tp["steps_per_s"],
                    "ratio_steps_to_raw": tp["steps_per_s"] / raw_rate,
                    "worker_cpu_ms_per_step": tp["cpu_ms_per_step"],
                    "ms_per_step_low_load_p50": seq["per_step"]["p50"],
                    "runtime_ms_per_step_low_load_p50": seq["runtime_per_step"]["p50"],
                    "commits_per_step": tp["commits_per_step"],
                    "step_ms_target": STEP_MS_TARGET,
                    "step_ms_verdict": "PASS" if ms_ok else "MISS",
                    "step_commits_target": STEP_COMMITS_TARGET,
                    "step_commits_verdict": "PASS" if commits_ok else "MISS",
                },
            }
        )
    )
    if args.profile_worker:
        print_profile(args.profile_worker, 50)
    return 0


# -- the sweep: cost per step against the length of the conversation -------------------

SWEEP_TARGET = 2.0  # at the longest conversation, at most this many times the shortest's


def sweep_app(timings: dict[str, list[tuple[float, float, int]]]) -> Registry:
    """An agent whose runs call ``echo`` once, then answer; each run appends
    ``(run wall s, model s, steps)`` to ``timings[its url]``. The model's time is all
    of ``ScriptedModel.complete`` (its usage estimate included: that is the fake
    model's own work). Each conversation has its model, as a long-lived agent would:
    the estimate measures only what a request adds to the last one of that model."""
    reg = Registry()

    calls = itertools.count(1)

    def step(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]["content"]
        if any(block.get("type") == "tool_result" for block in last):
            return ScriptedModel.text("Done: the tool echoed it.")
        # Unique ids: ScriptedModel numbers calls by the requests it keeps, cleared below.
        call = {"type": "tool_use", "id": f"toolu_{next(calls)}", "name": "echo"}
        return ModelResponse(content=[{**call, "input": {"text": "ping"}}], stop_reason="tool_use")

    models: dict[str, TimedModel] = {}

    @reg.entity("agent")
    async def agent(ctx: HandlerContext) -> None:
        model = models.setdefault(ctx.entity_url, TimedModel(step))
        ctx.use_agent(system_prompt="You echo.", model=model, tools=[ECHO])
        before, started = model.seconds, time.perf_counter()
        result = await ctx.agent.run()
        timing = (time.perf_counter() - started, model.seconds - before, result.steps)
        timings.setdefault(ctx.entity_url, []).append(timing)
        model.requests.clear()  # it records every request: not needed here

    return reg


class SnapshotWrites:
    """What the commits of the swept entity wrote: every commit, and of the commits that
    wrote a snapshot, the snapshot's bytes and its new conversation chunks' bytes (a
    wrapper of ``Store.commit``, installed for the sweep)."""

    def __init__(self) -> None:
        self.commits: dict[str, int] = {}
        self.snapshots: dict[str, list[tuple[int, int]]] = {}  # (snapshot, new chunks) bytes
        self._original = Store.commit

    def install(self) -> None:
        original, writes = self._original, self

        async def commit(store: Store, url: str, token: str, **kwargs: Any) -> list[str]:
            ids = await original(store, url, token, **kwargs)
            writes.commits[url] = writes.commits.get(url, 0) + 1
            if kwargs.get("snapshot"):
                chunks = sum(len(data) for _, data in kwargs.get("chunks", ()))
                writes.snapshots.setdefault(url, []).append((len(kwargs["snapshot"]), chunks))
            return ids

        Store.commit = commit  # type: ignore[method-assign]

    def uninstall(self) -> None:
        Store.commit = self._original  # type: ignore[method-assign]

    def reset(self) -> None:
        self.commits, self.snapshots = {}, {}


async def stored_bytes(rt: Runtime, url: str) -> tuple[int, int]:
    """(the snapshot's bytes, its conversation chunks' bytes) as stored in Redis now."""
    assert rt.store is not None
    keys = rt.store.keys
    snapshot = await rt.store.redis.strlen(keys.snap(url))
    chunks = await rt.store.redis.hvals(keys.conv(url))
    return int(snapshot), sum(len(c) for c in chunks)


def inline_snapshot_bytes(state: Any) -> int:
    """The snapshot's bytes with the whole conversation inline (as before chunks)."""
    return len(state.snapshot())


async def sweep_main(args: argparse.Namespace) -> int:
    """ms per step (the runtime's: the model's own time taken out) and what snapshots
    write after 10, 100 and 1,000 prior turns of one tool call each, next to the raw
    redis-py consume loop in the same run."""
    r = Redis.from_url(args.redis, decode_responses=False)
    machine = await describe_machine(r)
    machine["code"] = code_version()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    machine["load_average"] = list(load) if load else None
    print("load average: " + (" ".join(f"{x:.2f}" for x in load) if load else "?"))
    checkpoints = [10, 30, 100] if args.quick else [10, 100, 1000]
    measured = args.sweep_runs
    print(
        f"sweep: one conversation per point, runs of 2 model steps + 1 tool call; "
        f"{measured} runs of each measured, in turn, after "
        f"{', '.join(f'{n:,}' for n in checkpoints)} prior turns; worker "
        f"and client in this process on the Redis above, a snapshot every "
        f"{args.snapshot_every} log entries; runtime at {machine['code']}; target: at "
        f"{checkpoints[-1]:,} turns at most {SWEEP_TARGET:g}x the cost at {checkpoints[0]:,}",
        flush=True,
    )
    base = unique_prefix("wksweep")
    timings: dict[str, list[tuple[float, float, int]]] = {}
    writes = SnapshotWrites()
    rows: list[dict[str, Any]] = []
    urls = {checkpoint: f"/agent/sweep{checkpoint}" for checkpoint in checkpoints}
    try:
        raw = await run_raw_throughput(
            __file__,
            r,
            args.redis,
            f"{base}-r",
            partitions=args.partitions,
            entities=1000,
            messages=args.raw_messages,
        )
        raw_ms = 1000 / raw["msgs_per_s"]
        print(
            f"  raw redis-py consume loop: {fmt(raw['msgs_per_s'])} msgs/s, {raw_ms:.3f} ms and "
            f"{raw['cpu_us_per_msg']:.1f} CPU us per message",
            flush=True,
        )
        settings = Settings.from_env(
            redis_url=args.redis,
            prefix=f"{base}-w",
            partitions=args.partitions,
            snapshot_every=args.snapshot_every,
        )
        rt = Runtime(sweep_app(timings), settings=settings, run_worker=True)
        await rt.start()
        writes.install()
        try:
            # One conversation per point, grown to its length first; then the measured
            # runs go round the conversations, so that the load of the machine (shared,
            # changing) weighs on every point alike.
            for checkpoint, url in urls.items():
                for turn in range(checkpoint):
                    await rt.ask(url, f"turn {turn}", timeout=120)
                print(f"  {url}: {checkpoint:,} turns", flush=True)
            if args.gc_freeze:  # as a long-running worker does (see --no-gc-freeze)
                settle_for_long_run()
            timings.clear()
            writes.reset()
            # The profiler (--profile-worker) covers every point alike, since it slows
            # what it profiles; its figures are per point in the callers of the handler.
            profiler = cProfile.Profile() if args.profile_worker else None
            if profiler is not None:
                profiler.enable()
            for n in range(measured):
                for url in urls.values():
                    await rt.ask(url, f"measured turn {n}", timeout=120)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile_worker)
            for checkpoint, url in urls.items():
                per_step = [(run - model) / steps for run, model, steps in timings[url] if steps]
                snapshot, chunks = await stored_bytes(rt, url)
                state = await rt._folded(url)
                snaps = writes.snapshots.get(url, [])
                written = [snap + new for snap, new in snaps]
                commits = writes.commits.get(url, 0)
                rows.append(
                    {
                        "turns": checkpoint,
                        "events": len(state.system.history),
                        "ms_per_step": statistics.median(per_step) * 1000,
                        "commits": commits,
                        "snapshot_commits": len(snaps),
                        # per snapshot-writing commit: the snapshot, and with its chunks
                        "snapshot_bytes": statistics.fmean(s for s, _ in snaps) if snaps else 0,
                        "written_per_snapshot": statistics.fmean(written) if written else 0,
                        # spread over every commit of the measured runs
                        "written_per_commit": sum(written) / max(1, commits),
                        "stored_snapshot": snapshot,
                        "stored_chunks": chunks,
                        "inline_snapshot": inline_snapshot_bytes(state),
                    }
                )
                row = rows[-1]
                print(
                    f"  {checkpoint:>6,} prior turns ({row['events']:,} events after): "
                    f"{row['ms_per_step']:7.2f} ms per step (median of {len(per_step)} runs, "
                    f"{row['ms_per_step'] / raw_ms:5.1f}x a raw message); "
                    f"{row['snapshot_commits']} snapshots in {row['commits']} commits, each "
                    f"{fmt(row['snapshot_bytes'])} B + "
                    f"{fmt(row['written_per_snapshot'] - row['snapshot_bytes'])} B of new chunks "
                    f"({fmt(row['written_per_commit'])} B per commit); stored: snapshot "
                    f"{fmt(snapshot)} B + chunks {fmt(chunks)} B (inline it would be "
                    f"{fmt(row['inline_snapshot'])} B)",
                    flush=True,
                )
        finally:
            writes.uninstall()
            await rt.close()
    finally:
        for side in "rw":
            await delete_prefix(r, f"{base}-{side}")
        await r.aclose()
    first, last = rows[0], rows[-1]
    ratio = last["ms_per_step"] / first["ms_per_step"]
    verdict = "PASS" if ratio <= SWEEP_TARGET else "MISS"
    # Snapshot bytes written per snapshot-writing commit; without a snapshot in the first
    # window there is nothing to compare.
    snap_ratio = (
        last["written_per_snapshot"] / first["written_per_snapshot"]
        if first["written_per_snapshot"] and last["written_per_snapshot"]
        else None
    )
    snap_verdict = "?" if snap_ratio is None else "PASS" if snap_ratio <= SWEEP_TARGET else "MISS"
    print(
        f"ms per step at {last['turns']:,} turns: {ratio:.2f}x the cost at {first['turns']:,} "
        f"(target <= {SWEEP_TARGET:g}x): {verdict}"
    )
    print(
        f"bytes a snapshot writes at {last['turns']:,} turns: "
        + (f"{snap_ratio:.2f}x" if snap_ratio is not None else "?")
        + f" those at {first['turns']:,} (target <= {SWEEP_TARGET:g}x): {snap_verdict}"
    )
    emit(
        machine=machine,
        raw=raw,
        sweep=rows,
        ratio=ratio,
        snapshot_ratio=snap_ratio,
        verdict=verdict,
        snapshot_verdict=snap_verdict,
    )
    if args.profile_worker:
        print_profile(args.profile_worker, 50)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Wakeful agent-loop overhead per step next to a raw redis-py loop.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_redis_argument(parser)
    parser.add_argument("--entities", type=int, default=200, help="throughput phase")
    parser.add_argument("--runs", type=int, default=5, help="runs per entity, throughput phase")
    parser.add_argument(
        "--seq-runs", type=int, default=50, help="low-load phase: runs of one conversation"
    )
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured runs first")
    parser.add_argument(
        "--tool-steps", type=int, default=1, help="tool-calling steps per run (then a text step)"
    )
    parser.add_argument("--raw-messages", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 20 entities x 2 runs, 10 sequential runs, 5,000 raw messages",
    )
    add_profiling_arguments(
        parser,
        ["seq", "tp"],
        "which phase --profile-worker covers: seq (low load) or tp (throughput)",
    )
    add_gc_freeze_argument(parser)
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="only the sweep: ms per step and snapshot bytes after 10, 100 and 1,000 prior "
        "turns (30 and 100 with --quick), worker and client in this process "
        "(--profile-worker FILE profiles the measured runs)",
    )
    parser.add_argument("--sweep-runs", type=int, default=20, help="runs measured per point")
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=50,
        help="sweep: a snapshot every this many log entries (so each point writes some)",
    )
    # internal: the consumer processes
    parser.add_argument(
        "--role", choices=["main", "worker", "raw"], default="main", help=argparse.SUPPRESS
    )
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.entities, args.runs, args.seq_runs, args.warmup = 20, 2, 10, 2
        args.raw_messages = 5000
    if (
        min(args.entities, args.runs, args.seq_runs, args.raw_messages, args.partitions) < 1
        or args.tool_steps < 0
        or args.warmup < 0
    ):
        parser.error("sizes must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.role == "worker":
            asyncio.run(worker_main(args))
            return 0
        if args.role == "raw":
            asyncio.run(raw_consume(args.redis, args.prefix, args.partitions, args.expect))
            return 0
        if args.sweep:
            return asyncio.run(sweep_main(args))
        return asyncio.run(main_async(args))
    except ResponseError as exc:
        print(f"bench_agent: Redis error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
