"""Fuzz one target in this process: `python -m tests.fuzz.one TARGET [libFuzzer args...]`.

The code under test (`sidecar`) is imported instrumented,
so libFuzzer's coverage guides the inputs; an exception out of the target is an escape:
atheris prints it, libFuzzer writes the input to its artifact file and exits non-zero.
"""

from __future__ import annotations

import os
import sys

import atheris

from tests.fuzz import LAUNCHER

with atheris.instrument_imports(include=["sidecar"]):
    from tests.fuzz.targets import BROKEN, TARGETS


def main() -> None:
    name = sys.argv[1]
    target = {**TARGETS, **BROKEN}[name]
    # libFuzzer starts itself again for `-merge=1` from its argv[0]: the runner's launcher.
    argv0 = os.environ.get(LAUNCHER, sys.argv[0])
    atheris.Setup([argv0, *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
