"""Running a command on a pseudo-terminal, as a user at a terminal would.

The CLI behaves differently on a terminal (spinners, colours, prompts that wait for
an answer, Ctrl-C), so those paths are tested on a real pty, not with pipes.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run before the command, in its process (exec keeps the pid): SIGINT back at its default,
# as an interactive shell sets it for the command it runs in the foreground. The suite
# itself may have been started with SIGINT ignored (a script's `cmd &` or `nohup cmd &`,
# by POSIX, when the shell has no job control), and a command inherits an ignored signal:
# Python then keeps ignoring Ctrl-C and asyncio installs no handler for it. Not in
# Popen's preexec_fn: that runs Python between fork and exec, unsafe with threads (the
# tests call this from asyncio.to_thread).
AS_A_SHELL_RUNS_IT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def on_a_terminal(
    command: list[str], env: dict[str, str], prompt: str, answer: str | int
) -> tuple[int | None, str]:
    """Run ``command`` on a pseudo-terminal, as a shell runs a command in the foreground
    (SIGINT at its default, even if the suite ignores it: see :data:`AS_A_SHELL_RUNS_IT`);
    once ``prompt`` shows, type ``answer`` (a str) or send it the signal ``answer`` (an
    int). Returns its exit code (None if it still ran 30 s after the answer: its stacks
    are then dumped into the output) and everything it printed, followed by
    ``[answered: True|False]``."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", AS_A_SHELL_RUNS_IT, *command],
        cwd=ROOT,
        env={**env, "PYTHONFAULTHANDLER": "1"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    output, answered, deadline = b"", False, time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if not answered and prompt.encode() in output:
                if isinstance(answer, int):
                    proc.send_signal(answer)
                else:
                    os.write(master, answer.encode())
                answered = True
            if proc.poll() is not None and not ready:
                break
        try:
            code: int | None = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None  # still running: the assertion shows what it printed, and where
            proc.send_signal(signal.SIGABRT)  # it hangs (PYTHONFAULTHANDLER dumps the stacks)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            output += _drain(master)
        return code, output.decode(errors="replace") + f"\n[answered: {answered}]"
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def interrupted_on_a_terminal(command: list[str], env: dict[str, str], until_text: str) -> str:
    """Run ``command`` on a pseudo-terminal until it prints ``until_text``, then Ctrl-C
    it (SIGINT); everything it printed. Fails if the text never showed or the command
    did not stop."""
    code, output = on_a_terminal(command, env, until_text, signal.SIGINT)
    assert output.endswith("[answered: True]"), output
    assert code is not None, output
    return output


def _drain(master: int) -> bytes:
    out = b""
    while select.select([master], [], [], 0.5)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out
