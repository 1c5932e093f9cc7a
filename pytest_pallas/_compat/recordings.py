"""What the interpreter's callbacks report while a test listens: each listener's own list."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

Item = TypeVar("Item")


class Recordings(Generic[Item]):
    """Lists that collect items reported from any thread (each simulated core is one) while
    :meth:`recorded` blocks are open: every open block gets each distinct item once."""

    def __init__(self) -> None:
        self._lists: list[list[Item]] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def recorded(self) -> Iterator[list[Item]]:
        """A list that collects every item :meth:`add` reports while the block runs."""
        found: list[Item] = []
        with self._lock:
            self._lists.append(found)
        try:
            yield found
        finally:
            with self._lock:
                # By identity: equal lists are not the same listener.
                self._lists[:] = [each for each in self._lists if each is not found]

    def listening(self) -> bool:
        """Whether a block is open (an item nobody records need not be built)."""
        with self._lock:
            return bool(self._lists)

    def add(self, item: Item) -> None:
        """Report ``item`` to every open block that has not recorded an equal one."""
        with self._lock:
            for found in self._lists:
                if item not in found:
                    found.append(item)
