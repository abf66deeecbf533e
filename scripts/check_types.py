"""Static checks of the package as it installs: mypy and the import layers.

The repository keeps ``runtime/``, ``entities/`` and ``tools/`` at the top level and
installs them as ``wakeful``, ``wakeful.entities`` and ``wakeful.tools``. Static tools
cannot follow setuptools' editable-install finder, so this script lays the installed
shape out as a tree of links in a temporary folder, runs the tools on it, and prints
their findings with the repository's own paths.

    python scripts/check_types.py            # mypy, then import-linter
    python scripts/check_types.py mypy       # one of them
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where each installed package lives in the repository (pyproject's package-dir).
LAYOUT = {"wakeful": "runtime", "wakeful/entities": "entities", "wakeful/tools": "tools"}


def lay_out(into: Path) -> None:
    """Link every source file of the repository where the installed package has it."""
    for installed, source in LAYOUT.items():
        target = into / installed
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted((ROOT / source).iterdir()):
            if path.suffix in {".py", ".typed"}:
                (target / path.name).symlink_to(path)


def _repo_paths(text: str, tree: Path) -> str:
    text = "\n" + text
    for installed, source in sorted(LAYOUT.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"{tree}/{installed}/", f"{source}/")
        text = text.replace(f"\n{installed}/", f"\n{source}/")
    return text.replace(f"{tree}/", "")[1:]


def run(tool: str, tree: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree), "MYPYPATH": str(tree)}
    if tool == "mypy":
        command = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "-p",
            "wakeful",
        ]
    else:
        command = [
            str(Path(sys.executable).parent / "lint-imports"),
            str(ROOT / "pyproject.toml"),
            "--no-cache",
        ]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    output = _repo_paths(done.stdout + done.stderr, tree)
    print(output.rstrip())
    return done.returncode


def main(argv: list[str]) -> int:
    tools = argv or ["mypy", "imports"]
    with tempfile.TemporaryDirectory(prefix="wakeful-check-") as folder:
        tree = Path(folder)
        lay_out(tree)
        failed = [tool for tool in tools if run(tool, tree) != 0]
    if failed:
        print(f"static checks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
