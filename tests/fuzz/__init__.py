"""Coverage-guided fuzzing (atheris) of what the sidecar reads from others: `targets.py`
names the targets and what each may answer, `python -m tests.fuzz` runs them."""

LAUNCHER = "RSUB_FUZZ_LAUNCHER"
"""Names, for `tests.fuzz.one`, the executable that runs it for one target (libFuzzer's merge
starts its argv[0] again; see `tests.fuzz.__main__.launcher`)."""
