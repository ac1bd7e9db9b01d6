"""What the dashboard's two lists (a host's runs, a job's ranks) share, as k9s and htop do it: a sort column that
``o`` cycles and ``O`` reverses, shown by an arrow on its header, and a filter line that ``/`` opens.

The filter keeps the rows where the text typed appears, case-insensitively, in any cell (the text as painted, before
a narrow column cut it). Sorting is stable: rows that tie, and rows whose value is unknown (always last), keep the
order the host gave them. Pure helpers and one widget; nothing here reads files, sockets or the clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Optional, Sequence, TypeVar

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Input, Label

T = TypeVar("T")

UP, DOWN = "↑", "↓"


@dataclass(frozen=True)
class SortColumn(Generic[T]):
    label: str
    key: Callable[[T], Any]  # the value rows are ordered by; None for unknown (sorted last either way)
    descending: bool = False  # the direction it starts in when chosen (the most progress first, say)


@dataclass(frozen=True)
class SortOrder:
    column: int
    reverse: bool

    def next(self, columns: Sequence[SortColumn[Any]]) -> "SortOrder":
        """The next column, in its own starting direction."""
        index = (self.column + 1) % len(columns)
        return SortOrder(index, columns[index].descending)

    def flipped(self) -> "SortOrder":
        return SortOrder(self.column, not self.reverse)


def sort_mark(order: SortOrder) -> str:
    return DOWN if order.reverse else UP


def sort_rows(rows: Iterable[T], column: SortColumn[T], reverse: bool) -> list[T]:
    """Rows in the column's order (``reverse`` for descending), stable, unknown values last."""
    items = list(rows)
    known = [row for row in items if column.key(row) is not None]
    unknown = [row for row in items if column.key(row) is None]
    return sorted(known, key=column.key, reverse=reverse) + unknown


def matches(texts: Iterable[str], query: str) -> bool:
    """Whether ``query`` (trimmed, any case) is in one of ``texts``; an empty query keeps every row."""
    needle = query.strip().casefold()
    return not needle or any(needle in text.casefold() for text in texts)


class FilterBar(Horizontal):
    """The filter line under a list: hidden until ``/``, it stays while a filter is set, saying how many rows it
    keeps. Its input posts Input.Changed and Input.Submitted as any Input does."""

    DEFAULT_CSS = """
    FilterBar { height: 1; display: none; background: $boost; }
    FilterBar.visible { display: block; }
    FilterBar > Label { width: auto; padding: 0 1; color: $text-muted; }
    FilterBar > Input { width: 1fr; height: 1; border: none; padding: 0; background: $boost; }
    FilterBar > Input:focus { border: none; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:  # noqa: A002 (Textual's name)
        super().__init__(id=id)

    def compose(self) -> ComposeResult:
        yield Label("/", markup=False)
        yield Input(placeholder="text in any column · Enter keeps · Esc clears", id="filter-input")
        yield Label("", id="filter-count", markup=False)

    @property
    def input(self) -> Input:
        return self.query_one(Input)

    @property
    def value(self) -> str:
        return self.input.value

    def open(self) -> None:
        self.add_class("visible")
        self.input.focus()

    def clear(self) -> None:
        self.input.value = ""
        self.remove_class("visible")

    def close_if_empty(self) -> None:
        if not self.value.strip():
            self.clear()

    def count(self, shown: int, total: int, noun: str) -> None:
        """What the filter keeps, at the line's end: ``2 of 5 ranks``."""
        self.query_one("#filter-count", Label).update(f"{shown} of {total} {noun}" if self.value.strip() else "")
