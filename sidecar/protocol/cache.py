"""Bounded per-subscription cache of completed snapshots, ordered by local position.

When full, the cache evicts the interior entry whose removal leaves the smallest gap
between its neighbours, so the survivors stay spread over the backlog; the oldest and the
newest entries are never evicted. Eviction uses a heap of candidate gaps with lazy
invalidation, so insertion costs O(log n) plus a list shift.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import Generic, TypeVar

T = TypeVar("T")


class SnapshotCache(Generic[T]):
    __slots__ = ("_capacity", "_heap", "_items", "_positions")

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"cache capacity must be at least 2, got {capacity}")
        self._capacity = capacity
        self._positions: list[int] = []
        self._items: dict[int, T] = {}
        # (gap if removed, position, previous position, next position); stale when the
        # neighbours changed or the entry is gone.
        self._heap: list[tuple[int, int, int, int]] = []

    def __len__(self) -> int:
        return len(self._positions)

    def positions(self) -> list[int]:
        return list(self._positions)

    def add(self, position: int, item: T) -> None:
        """Insert an entry; a position already cached replaces nothing."""
        positions = self._positions
        if position in self._items:
            return
        if not positions or position > positions[-1]:
            positions.append(position)
            index = len(positions) - 1
        else:
            index = bisect_left(positions, position)
            positions.insert(index, position)
        self._items[position] = item
        for i in (index - 1, index, index + 1):
            self._push(i)
        if len(positions) > self._capacity:
            self._evict()
        if len(self._heap) > 4 * len(positions) + 16:
            self._rebuild_heap()

    def floor(self, position: int) -> T | None:
        """The newest entry at or below `position`, left in place."""
        index = bisect_right(self._positions, position)
        return self._items[self._positions[index - 1]] if index else None

    def advance(self, position: int) -> T | None:
        """Pop every entry at or below `position`; return the newest of them."""
        positions = self._positions
        index = bisect_right(positions, position)
        if not index:
            return None
        newest = self._items[positions[index - 1]]
        for p in positions[:index]:
            del self._items[p]
        del positions[:index]
        return newest

    def _push(self, index: int) -> None:
        positions = self._positions
        if 0 < index < len(positions) - 1:
            prev, cur, nxt = positions[index - 1], positions[index], positions[index + 1]
            heapq.heappush(self._heap, (nxt - prev, cur, prev, nxt))

    def _evict(self) -> None:
        positions = self._positions
        heap = self._heap
        while heap:
            _, cur, prev, nxt = heapq.heappop(heap)
            index = bisect_left(positions, cur)
            if (
                0 < index < len(positions) - 1
                and positions[index] == cur
                and positions[index - 1] == prev
                and positions[index + 1] == nxt
            ):
                del positions[index]
                del self._items[cur]
                self._push(index - 1)
                self._push(index)
                return

    def _rebuild_heap(self) -> None:
        p = self._positions
        self._heap = [(p[i + 1] - p[i - 1], p[i], p[i - 1], p[i + 1]) for i in range(1, len(p) - 1)]
        heapq.heapify(self._heap)
