"""Progress reporting hooks. Library code takes a ``progress`` factory; only the CLI draws bars."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

# progress(iterable, length, label) -> an iterable yielding the same items.
Progress = Callable[[Iterable[T], int, str], Iterable[T]]


def no_progress(iterable: Iterable[T], length: int, label: str) -> Iterator[T]:
    """The default: iterate silently."""
    return iter(iterable)
