"""What the exact client skips (`sidecar.exact.covered`): at or below the vector, or inside a
range acked above a floor elsewhere (docs/protocol.md §6)."""

from __future__ import annotations

import pytest

from sidecar.exact import Progress, covered

PROGRESS = Progress({"west": 10, "east": 3}, {"west": ((12, 14), (20, 20)), "central": ((5, 6),)})


@pytest.mark.parametrize(
    ("origin", "skipped"),
    [
        (("west", 10), True),
        (("west", 11), False),
        (("west", 12), True),
        (("west", 14), True),
        (("west", 15), False),
        (("west", 19), False),
        (("west", 20), True),
        (("west", 21), False),
        (("east", 3), True),
        (("east", 4), False),
        (("central", 4), False),
        (("central", 5), True),
        (("central", 6), True),
        (("central", 7), False),
        (("north", 1), False),
        (None, False),
    ],
)
def test_covered_by_the_vector_or_a_range(origin: tuple[str, int] | None, skipped: bool) -> None:
    assert covered(origin, PROGRESS) is skipped


def test_a_progress_is_the_vector_as_a_mapping() -> None:
    assert PROGRESS == {"west": 10, "east": 3}
    assert dict(PROGRESS) == {"west": 10, "east": 3} and len(PROGRESS) == 2
    # A plain vector covers no range.
    assert not covered(("west", 12), {"west": 10})
