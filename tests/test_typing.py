"""The handler API is typed for its users: a checker follows rows, inputs and tool contexts.

mypy runs on a small user module against the package as it installs (the layout of
``scripts/check_types.py``) and must report exactly the wrong field names in it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mypy import api

from scripts.check_types import ROOT, lay_out

USER_MODULE = """
from __future__ import annotations

import msgspec

from wakeful import Collection, HandlerContext, Registry, ToolContext, define_tool, tool


class Counter(msgspec.Struct):
    key: str
    total: int


class Question(msgspec.Struct):
    text: str


class Answer(msgspec.Struct):
    text: str


class Session(msgspec.Struct):
    user: str


registry = Registry()


@registry.entity("counter", state={"counts": Collection(row=Counter)})
async def counter(ctx: HandlerContext) -> None:
    counts = ctx.db.collection("counts", Counter)
    row = counts.get("total")
    if row is not None:
        reveal_type(row)
        print(row.totl)  # a wrong field
    counts.insert(Counter("total", 1))
    counts.insert(Answer("not a counter"))  # a wrong row type
    for message in ctx.wake.messages:
        print(message.payload, message.sendr)  # a wrong field
    for finished in ctx.wake.runs_finished:
        print(finished.response)


async def answer(ctx: ToolContext[Question, Session]) -> Answer:
    return Answer(f"{ctx.context.usr}: {ctx.input.text}")  # a wrong field


@tool(id="example.echo/v1", description="Echoes.", input=Question, output=Answer)
async def echo(ctx: ToolContext[Answer, None]) -> Answer:  # a mismatched input type
    return Answer(ctx.input.text)


answering = define_tool(
    id="example.answer/v1",
    description="Answers.",
    input=Question,
    output=Answer,
    context=Session,
    execute=answer,
)
"""


def test_a_checker_follows_rows_wake_inputs_and_tool_contexts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "tree"
    lay_out(tree)
    monkeypatch.setenv("MYPYPATH", str(tree))
    user = tmp_path / "user_app.py"
    user.write_text(textwrap.dedent(USER_MODULE).lstrip("\n"))
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(user),
        ]
    )
    text = user.read_text().splitlines()

    def line_of(snippet: str) -> int:
        return next(n for n, line in enumerate(text, 1) if snippet in line)

    reports = [
        (int(line.split(":")[1]), line.split(": ", 1)[1])
        for line in stdout.splitlines()
        if line.startswith(f"{user}:")
    ]
    expected = [
        (line_of("reveal_type(row)"), 'note: Revealed type is "user_app.Counter"'),
        (line_of("row.totl"), 'error: "Counter" has no attribute "totl"'),
        (line_of("not a counter"), 'error: Argument 1 to "insert" of "CollectionHandle"'),
        (line_of("message.sendr"), 'error: "Message" has no attribute "sendr"'),
        (line_of("ctx.context.usr"), 'error: "Session" has no attribute "usr"'),
        (line_of("@tool("), "error: Argument 1 has incompatible type"),
    ]
    assert status == 1, stdout + stderr
    assert len(reports) == len(expected), reports
    for (line, report), (want_line, want) in zip(sorted(reports), expected, strict=True):
        assert (line, report[: len(want)]) == (want_line, want), reports


def test_the_library_imports_downward_only() -> None:
    """The layers of pyproject's ``[tool.importlinter]`` hold (no import cycles, even
    inside functions; only ``if TYPE_CHECKING:`` imports may point up)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_types.py"), "imports"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_every_module_of_the_library_has_a_layer() -> None:
    """A module missing from the layer list would go unchecked: every one is listed."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (layers,) = [
        c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"
    ]
    listed = {name.strip() for layer in layers for name in layer.split("|")}
    modules = {f"wakeful.{p.stem}" for p in (ROOT / "runtime").glob("*.py")} - {"wakeful.__init__"}
    assert modules - listed == set()
    assert listed - modules == {"wakeful.entities", "wakeful.tools"}
