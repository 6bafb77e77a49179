"""`python -m sidecar.cli`: the `rsub` command."""

from sidecar.cli import main

raise SystemExit(main())
