"""Fuzz one target in this process: `python -m tests.fuzz.one TARGET [libFuzzer args...]`.

The code under test (`sidecar`) is imported instrumented,
so libFuzzer's coverage guides the inputs; an exception out of the target is an escape:
atheris prints it, libFuzzer writes the input to its artifact file and exits non-zero.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["sidecar"]):
    from tests.fuzz.targets import BROKEN, TARGETS


def main() -> None:
    name = sys.argv[1]
    target = {**TARGETS, **BROKEN}[name]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
