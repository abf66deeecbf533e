"""The garbage collector of a long-running process (``wakeful.heap``)."""

from __future__ import annotations

import subprocess
import sys

SETTLE = """
import gc
from wakeful.heap import YOUNG_GENERATION, settle_for_long_run

before = gc.get_threshold()
assert gc.get_freeze_count() == 0
settle_for_long_run()
print(gc.get_freeze_count() > 0, gc.get_threshold() == (YOUNG_GENERATION, *before[1:]))
"""


def test_a_settled_process_freezes_its_start_up_objects_and_collects_the_young_rarely():
    # In a process of its own: the setting is the whole interpreter's.
    done = subprocess.run(
        [sys.executable, "-c", SETTLE], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "True"]
