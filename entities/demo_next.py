"""What the demo prints at its end: commands to try next, each runnable as printed."""

from __future__ import annotations

import shlex
import shutil
import sys
import textwrap
from pathlib import Path

from .demo_transcript import say

REDIS_HINT = "redis://127.0.0.1:6379/0"


def wakeful_command() -> str:
    """``wakeful`` as the user's shell runs it: the script beside this Python (relative
    to the current directory when it is below it), or plain ``wakeful`` when that is
    the same script on PATH (an activated venv)."""
    here = Path(sys.executable).parent
    script = here / "wakeful"
    if not script.exists():
        return shlex.join([_shown_path(Path(sys.executable)), "-m", "wakeful.cli"])
    found = shutil.which("wakeful")
    if found is not None and Path(found).absolute() == script.absolute():
        return "wakeful"
    return _shown_path(script)


def _shown_path(path: Path) -> str:
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path.absolute())


def next_steps() -> list[tuple[str, str]]:
    """What to try next: (command, what it does), each runnable as printed."""
    w = wakeful_command()
    app = "wakeful.entities:registry"
    redis = f"--redis {REDIS_HINT}"
    question = shlex.quote("Remember that my favourite colour is teal.")
    return [
        (
            f"{w} serve {app}",
            "the web console at http://127.0.0.1:8000/console/: chat with the assistant "
            "(a worker and the embedded Redis in one process; Ctrl-C stops it)",
        ),
        (
            f"{w} worker {app} {redis}",
            "with a Redis server at 127.0.0.1:6379: a worker (leave it running)",
        ),
        (
            f"{w} ask /assistant/me {question} {redis}",
            "then, in another terminal, talk to the agent",
        ),
        (f"{w} tail /assistant/me {redis}", "and read its log as a transcript"),
        (f"{w} --help", "every command"),
    ]


def print_next_steps() -> None:
    say()
    say("What next? Each command runs as printed, from this directory:")
    for command, what in next_steps():
        say(textwrap.fill(what, 96, initial_indent="  # ", subsequent_indent="  # "))
        say(f"  $ {command}")
