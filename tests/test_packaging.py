"""The distribution installs one import name, ``wakeful``, and ships its types."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _build_wheel(out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("wakeful-*.whl")
    return wheel


def test_the_wheel_has_one_top_level_name_and_ships_its_types(tmp_path: Path) -> None:
    names = zipfile.ZipFile(_build_wheel(tmp_path)).namelist()
    top = {name.split("/", 1)[0] for name in names if not name.startswith("wakeful-")}
    assert top == {"wakeful"}
    for shipped in (
        "wakeful/py.typed",
        "wakeful/entities/assistant.py",
        "wakeful/tools/memory.py",
        "wakeful/console/index.html",
    ):
        assert shipped in names


def test_installed_package_imports_as_wakeful_only(tmp_path: Path) -> None:
    # Run from an empty folder, so the checkout's own folders are not on sys.path.
    probe = (
        "import importlib.util, wakeful, wakeful.entities, wakeful.tools\n"
        "print(sorted(n for n in ('runtime', 'tools', 'entities')"
        " if importlib.util.find_spec(n) is not None))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
