"""unity run and unity profile keep freed memory for reuse (glibc's mallopt)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from unity_cli.runtime.memory import keep_freed_memory

# Rounds of a step-like pattern: three 8 MiB temporaries and a 40 MiB one, all freed; prints
# whether keeping took effect, then the page faults of each round after the first.
_ROUNDS = """
import resource, sys, numpy as np
from unity_cli.runtime.memory import keep_freed_memory
print(keep_freed_memory())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for r in range(4):
    f = faults()
    xs = [np.ones(1 << 21, np.float32) for _ in range(3)]
    big = np.ones(10 << 20, np.float32)
    del xs, big
    if r:
        print(faults() - f)
"""


def _rounds(keep: str) -> list[str]:
    env = {"UNITY_KEEP_FREED_MEMORY": keep, "PATH": ""}
    return subprocess.run([sys.executable, "-c", _ROUNDS], capture_output=True, text=True, check=True,
                          env=env).stdout.split()


def test_switched_off_by_the_environment():
    assert keep_freed_memory({"UNITY_KEEP_FREED_MEMORY": "0"}) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_step_no_longer_faults_its_memory_back_in():
    """With glibc's defaults every round faults in about 1500+ pages again (the 40 MiB block
    is unmapped, the heap top trimmed); kept, rounds after the first fault in none."""
    default, kept = _rounds("0"), _rounds("1")
    if kept[0] != "True":
        pytest.skip("not glibc")
    assert default[0] == "False" and min(int(n) for n in default[1:]) > 1000
    assert max(int(n) for n in kept[1:]) < 50
