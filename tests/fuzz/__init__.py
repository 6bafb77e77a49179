"""Coverage-guided fuzzing (atheris) of what the sidecar reads from others: `targets.py`
names the targets and what each may answer, `python -m tests.fuzz` runs them."""
