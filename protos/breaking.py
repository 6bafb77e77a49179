"""Check protos/ against the last released schema, protos/released (run by `make lint`).

`buf breaking` (rules in buf.yaml) reports every change that breaks clients of the released
schema. A finding listed in protos/accepted-breaks.txt is accepted; any other fails the
check, and so does a listed one that buf no longer reports. `--release` makes the current
schema the released one: it copies protos/rsub to protos/released/rsub and empties the list
(run by `make proto-release`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from itertools import takewhile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CURRENT = ROOT / "protos" / "rsub"
RELEASED = ROOT / "protos" / "released"
ACCEPTED = ROOT / "protos" / "accepted-breaks.txt"
BUF_FOUND_BREAKS = 100  # buf's exit code when it reports findings


def findings(buf: str) -> list[dict[str, str | int]]:
    """buf's breaking-change findings against the released schema, as its JSON objects."""
    result = subprocess.run(
        [buf, "breaking", "--against", str(RELEASED.relative_to(ROOT)), "--error-format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode not in (0, BUF_FOUND_BREAKS):
        raise SystemExit(f"buf breaking failed ({result.returncode}):\n{result.stderr}")
    found = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    # Protos that do not compile are reported as findings too, but compare nothing.
    errors = [
        f"{f['path']}:{f['start_line']}: {f['message']}" for f in found if f["type"] == "COMPILE"
    ]
    if errors:
        raise SystemExit("buf breaking failed: the protos do not compile\n" + "\n".join(errors))
    return found


def accepted() -> set[str]:
    lines = (line.strip() for line in ACCEPTED.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def check(buf: str) -> int:
    found = {f"{f['type']}: {f['message']}": f for f in findings(buf)}
    listed = accepted()
    new = [f for key, f in found.items() if key not in listed]
    stale = sorted(listed - found.keys())
    for f in new:
        print(f"{f['path']}:{f['start_line']}:{f['start_column']}: {f['type']}: {f['message']}")
    for key in stale:
        print(f"no longer reported, remove it from {ACCEPTED.relative_to(ROOT)}: {key}")
    if new or stale:
        print("breaking-change check failed (docs/api.md, 'Evolving the protos')")
        return 1
    print(f"no breaking change against {RELEASED.relative_to(ROOT)} ({len(found)} accepted)")
    return 0


def release() -> int:
    shutil.rmtree(RELEASED / CURRENT.name, ignore_errors=True)
    shutil.copytree(CURRENT, RELEASED / CURRENT.name)
    header = takewhile(lambda line: line.startswith("#"), ACCEPTED.read_text().splitlines())
    ACCEPTED.write_text("".join(f"{line}\n" for line in header))
    print(f"{RELEASED.relative_to(ROOT)} is now the schema of protos/; no break accepted")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--buf", help="the buf executable: check protos/ against the release")
    group.add_argument("--release", action="store_true", help="make protos/ the release")
    args = parser.parse_args()
    return release() if args.release else check(args.buf)


if __name__ == "__main__":
    raise SystemExit(main())
