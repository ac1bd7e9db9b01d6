"""The keys the dashboard's two lists (a host's runs, a job's ranks) share, in one place: ``/`` opens the filter line
(each key typed redraws, Enter keeps it, Esc clears it), ``o`` sorts by the next column and ``O`` reverses.

A list screen subclasses ``ListingScreen``, puts ``LISTING_BINDINGS`` in its ``BINDINGS`` (after its own Enter, which
must not fire while the filter line is typed in: ``ENTER_ACTION``), and says how it redraws and which column comes
next. The rows themselves, the filter's test and the order are the screen's (``widgets/listing.py`` helps)."""

from __future__ import annotations

from typing import Optional

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Input

from eaglewatch.tui.app.widgets.listing import FilterBar, SortOrder

LISTING_BINDINGS = [
    Binding("slash", "filter", "filter"),
    Binding("o", "sort_next", "sort"),
    Binding("O", "sort_reverse", "reverse sort", show=False),
    Binding("escape", "clear_filter", "clear filter", show=False),
]


class ListingScreen(Screen):
    ENTER_ACTION = ""  # the row's action on Enter; not taken while the filter line has the focus
    order: SortOrder

    def listing_changed(self) -> None:
        """Redraw the table now: the filter or the order changed."""
        raise NotImplementedError

    def next_order(self) -> SortOrder:
        """The order after ``o``: the next column, in its own starting direction."""
        raise NotImplementedError

    def check_action(self, action: str, parameters: tuple[object, ...]) -> Optional[bool]:
        if action == self.ENTER_ACTION and isinstance(self.focused, Input):
            return False  # Enter submits the filter
        return True

    def action_filter(self) -> None:
        self.query_one(FilterBar).open()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.listing_changed()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(FilterBar).close_if_empty()
        self.query_one(DataTable).focus()

    def action_clear_filter(self) -> None:
        bar = self.query_one(FilterBar)
        if bar.has_class("visible") or bar.value:
            bar.clear()
            self.query_one(DataTable).focus()
            self.listing_changed()

    def action_sort_next(self) -> None:
        self.order = self.next_order()
        self.listing_changed()

    def action_sort_reverse(self) -> None:
        self.order = self.order.flipped()
        self.listing_changed()
