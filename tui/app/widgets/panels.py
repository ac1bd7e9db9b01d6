"""The run screen's panels. Each shows a RunView it is handed; none reads files, sockets or the clock."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList, RichLog, Static
from textual.widgets.option_list import Option

from eaglewatch.safetext import safe_text
from eaglewatch.tui.app.widgets import render
from eaglewatch.tui.runstate import FailureView, LogLine, RunView
from eaglewatch.tui.runstate.jobkind import engine_free_tool

LEVEL_FILTERS = ("all", "warnings", "errors")
_LEVEL_RANK = {"DEBUG": 0, "INFO": 1, None: 1, "WARNING": 2, "ERROR": 3, "CRITICAL": 3}
_FILTER_MIN = {"all": 0, "warnings": 2, "errors": 3}


def _line_count(drawn: object) -> Optional[int]:
    """Lines of a drawn Text (the panels do not wrap); None for anything else, whose height is not known here."""
    return drawn.plain.count("\n") if isinstance(drawn, Text) else None


class ViewPanel(Static):
    """A panel drawn from the latest RunView; redrawn on a new view or a new size."""

    BORDER_TITLE = ""
    ALLOW_MAXIMIZE = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.view: Optional[RunView] = None
        self.border_title = self.BORDER_TITLE
        self._drawn: object = None

    def show(self, view: RunView) -> None:
        self.view = view
        self._put(self.draw(view, max(10, self.content_size.width or self.size.width or 80)))

    def on_resize(self) -> None:
        if self.view is not None:
            self._put(self.draw(self.view, max(10, self.content_size.width)))

    def _put(self, drawn) -> None:
        # A new view comes with every log line; most panels look the same after it. An update lays the whole
        # screen out again, which on a busy machine delays the frame that shows what did change (a failure).
        if drawn == self._drawn:
            return
        # Same number of lines, same size: a repaint of this panel will do, without laying the screen out again
        # (after a layout pass Textual repaints far more than the panel).
        lines = _line_count(drawn)
        same_height = lines is not None and lines == _line_count(self._drawn)
        self._drawn = drawn
        self.update(drawn, layout=not same_height)

    def draw(self, view: RunView, width: int):  # pragma: no cover - abstract
        raise NotImplementedError


class RunHeader(ViewPanel):
    read_only = False  # the screen sets it: the header then wears a READ-ONLY badge

    def draw(self, view: RunView, width: int):
        return render.header_text(view, width, read_only=self.read_only)


class LoadPanel(ViewPanel):
    """The loading bars; before them, while the job validates, the preflight's checklist."""

    BORDER_TITLE = "loading"

    def draw(self, view: RunView, width: int):
        tool = engine_free_tool(view.argv)
        if tool:
            self.border_title = tool
            return render.tool_text(view, width)
        if render.shows_preflight(view):
            self.border_title = "preflight"
            return render.preflight_text(view, width)
        self.border_title = self.BORDER_TITLE
        return render.load_text(view, width)


class ExtractionPanel(ViewPanel):
    BORDER_TITLE = "extraction"

    def draw(self, view: RunView, width: int):
        return render.extraction_text(view, width)


class GpuPanel(ViewPanel):
    BORDER_TITLE = "GPUs"

    def draw(self, view: RunView, width: int):
        self.border_subtitle = render.host_line(view) if view.gpus else ""
        detail = self.is_maximized or self.screen.has_class("wide")
        return render.gpu_text(view, width, wide=detail)


class FailurePanel(OptionList):
    """Failure groups, root cause first. Enter opens the full traceback."""

    BORDER_TITLE = "failures"
    ALLOW_MAXIMIZE = True

    class Open(Message):
        def __init__(self, failure: FailureView) -> None:
            super().__init__()
            self.failure = failure

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.failures: Optional[tuple[FailureView, ...]] = None  # None: nothing shown yet
        self._labelled: tuple[int, bool] = (0, False)  # the width and form the rows were drawn for
        self.border_title = self.BORDER_TITLE

    def show(self, view: RunView) -> None:
        if view.failures == self.failures:
            return
        keep = self.highlighted
        # The highlight stays on its failure (a provisional one refined in place keeps its ident), else its row;
        # but a new root cause at the top takes it, so that a short panel does not scroll the root cause away.
        kept = self.failures[keep].ident if self.failures and keep is not None and keep < len(self.failures) else None
        first = self.failures[0].ident if self.failures else None
        self.failures = view.failures
        if view.failures and first is not None and view.failures[0].ident != first:
            keep, kept = 0, None
        self._set_rows(keep, kept)

    @property
    def one_line(self) -> bool:
        """One line per failure: on a narrow screen, where the log needs the rows, unless full-screen (f)."""
        return not self.is_maximized and not self.screen.has_class("wide")

    def relabel(self) -> None:
        """Draw the rows again for a new size or a new layout (full-screen, wide, narrow)."""
        if self.failures:
            keep = self.highlighted
            kept = self.failures[keep].ident if keep is not None and keep < len(self.failures) else None
            self._set_rows(keep, kept)

    def _set_rows(self, keep: Optional[int], kept: Optional[str]) -> None:
        view_failures = self.failures or ()
        width = max(20, (self.content_size.width or 60) - 1)
        compact = self.one_line
        self._labelled = (width, compact)
        if view_failures:
            self.set_options([Option(render.failure_label(f, width, compact), id=str(f.position))
                              for f in view_failures])
            same = next((i for i, f in enumerate(view_failures) if kept and f.ident == kept), None)
            self.highlighted = same if same is not None else keep if keep is not None and keep < len(
                view_failures) else 0
            self.border_title = f"failures ({len(view_failures)}) · Enter: traceback"
            self.add_class("has-failures")
        else:
            self.set_options([Option("no failures", disabled=True)])
            self.border_title = self.BORDER_TITLE
            self.remove_class("has-failures")

    def on_resize(self) -> None:
        if self.failures and self._labelled != (max(20, (self.content_size.width or 60) - 1), self.one_line):
            self.relabel()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        index = event.option_index
        if self.failures and 0 <= index < len(self.failures):
            self.post_message(self.Open(self.failures[index]))


class LogPanel(RichLog):
    """The live log: \\r bars collapsed, lanes coloured, filtered by lane and level, searchable.

    It is handed new lines (the model's tail) and keeps at most ``max_lines`` on screen; filters and search
    redraw from the model's tail, which the screen passes in. A search highlights its matches and ``]``/``[`` jump
    between them (as ``n``/``N`` do in less); ``&`` keeps only the matching lines. The log follows new lines while
    its view is at the end, and stays where a jump or a scroll up left it until End.
    """

    ALLOW_MAXIMIZE = True
    BINDINGS = [
        Binding("v", "cycle_level", "level", show=False),
        Binding("n", "cycle_lane", "lane", show=False),
        Binding("right_square_bracket", "next_match", "next match", show=False),
        Binding("left_square_bracket", "previous_match", "previous match", show=False),
        Binding("ampersand", "toggle_only_matches", "only matches", show=False),
        Binding("w", "toggle_wrap", "wrap", show=False),
        Binding("end", "follow", "follow", show=False),
    ]

    class FilterChanged(Message):
        pass

    match_row: Optional[int] = None
    scrolled_away = False
    wrap = False

    def __init__(self, *args, max_lines: int = 2000, **kwargs) -> None:
        super().__init__(*args, max_lines=max_lines, wrap=False, markup=False, highlight=False, **kwargs)
        self.level_filter = "all"
        self.lane_filter: Optional[str] = None
        self.search: Optional[str] = None
        self.only_matches = False  # with a search: show only the lines that match it
        self.lanes: tuple[str, ...] = ()
        self.last_seq = 0
        self.shown = 0
        self.match_row: Optional[int] = None  # the row of the match a jump went to
        self.scrolled_away = False  # the reader scrolled up: new lines do not move the view
        self._title_shown: Optional[str] = None
        self._update_title()

    def _update_title(self) -> None:
        parts = [f"log · level {self.level_filter} (v)", f"lane {safe_text(self.lane_filter or 'all')} (n)"]
        if self.search:
            rows = self.match_rows()
            where = ""
            if self.match_row is not None and self.match_row in rows:
                where = f"{rows.index(self.match_row) + 1}/"
            only = " only" if self.only_matches else ""
            parts.append(f"search “{safe_text(self.search)}”{only} {where}{len(rows)} ([ ])")
        if self.wrap:
            parts.append("wrap")
        total = len(self.lines)
        if total > self.scrollable_content_region.height > 0:
            bottom = min(total, int(self.scroll_y) + self.scrollable_content_region.height)
            parts.append(f"{bottom}/{total}" if bottom < total else f"end/{total}")
        title = " · ".join(parts)
        if title != self._title_shown:
            self._title_shown = title
            # Rich Text, not a markup string: a search for "[/]" or a lane named "[b]" is text, not a markup error.
            self.border_title = Text(title)

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if self.scrolled_away and new >= self.max_scroll_y:
            self.scrolled_away = False
        self._update_title()

    def accepts(self, line: LogLine) -> bool:
        if self.lane_filter is not None and line.lane != self.lane_filter:
            return False
        if _LEVEL_RANK.get(line.level, 1) < _FILTER_MIN[self.level_filter]:
            return False
        if self.search and self.only_matches and self.search.lower() not in safe_text(line.text, "\t").lower():
            return False  # as it is shown
        return True

    @property
    def following(self) -> bool:
        """Whether new lines scroll the view: unless a jump or a scroll up moved it away from the end."""
        return self.auto_scroll and self.match_row is None and not self.scrolled_away

    # The reader's own moves up (keys, wheel) pin the view; reaching the end again, or End, lets it follow.
    def _away(self) -> None:
        self.scrolled_away = self.max_scroll_y > 0  # the scroll itself may land a frame later
        self._update_title()

    def action_scroll_up(self) -> None:
        super().action_scroll_up()
        self._away()

    def action_page_up(self) -> None:
        super().action_page_up()
        self._away()

    def action_scroll_home(self) -> None:
        super().action_scroll_home()
        self._away()

    def _on_mouse_scroll_up(self, event) -> None:
        super()._on_mouse_scroll_up(event)
        self._away()

    def add_lines(self, lines: list[LogLine], cap: Optional[int] = None) -> None:
        """Append the lines that pass the filters; of a burst, only the last ``cap`` (what a reader can see
        scroll by: the rest stays in the model's tail and the run's log file)."""
        if not lines:
            return
        self.last_seq = lines[-1].seq
        picked = [line for line in lines if self.accepts(line)]
        limit = min(cap or self.max_lines or len(picked), self.max_lines or len(picked))
        if len(picked) > limit:
            picked = picked[-limit:]
        if picked:
            follow = self.following
            # One write for the batch: half the cost of a write per line, and the UI thread is shared with
            # everything else that has to reach the screen.
            drawn = Text("\n", no_wrap=not self.wrap).join(
                render.log_line_text(line, search=self.search) for line in picked)
            self.write(drawn, scroll_end=False)
            self.shown += len(picked)
            if follow:
                self.scroll_end(animate=False, immediate=False, x_axis=False)
        self._update_title()

    def redraw(self, lines: list[LogLine]) -> None:
        self.clear()
        self.shown = 0
        self.last_seq = 0
        self.match_row = None
        self.add_lines(lines)
        self._update_title()

    def set_search(self, text: Optional[str]) -> None:
        self.search = text or None
        if not self.search:
            self.only_matches = False
        self.post_message(self.FilterChanged())

    def match_rows(self) -> list[int]:
        """The rows on screen whose text holds the search (as it is shown)."""
        if not self.search:
            return []
        needle = self.search.lower()
        return [row for row, strip in enumerate(self.lines) if needle in strip.text.lower()]

    def _jump(self, forward: bool) -> None:
        rows = self.match_rows()
        if not rows:
            if self.search:
                self.notify(f"no line matches “{safe_text(self.search)}”", severity="warning", timeout=3)
            return
        height = max(1, self.scrollable_content_region.height)
        # From the last match jumped to; else from the view: forward from its top, back from its bottom.
        here = self.match_row if self.match_row is not None else (
            int(self.scroll_y) - 1 if forward else int(self.scroll_y) + height)
        if forward:
            row = next((r for r in rows if r > here), rows[0])
        else:
            row = next((r for r in reversed(rows) if r < here), rows[-1])
        self.match_row = row
        self.scroll_to(y=max(0, row - height // 2), animate=False, immediate=True)
        self._update_title()

    def action_next_match(self) -> None:
        self._jump(forward=True)

    def action_previous_match(self) -> None:
        self._jump(forward=False)

    def action_toggle_only_matches(self) -> None:
        if not self.search:
            self.notify("search first (/): & then keeps only the matching lines", timeout=3)
            return
        self.only_matches = not self.only_matches
        self.post_message(self.FilterChanged())

    def action_toggle_wrap(self) -> None:
        self.wrap = not self.wrap
        self.post_message(self.FilterChanged())

    def action_follow(self) -> None:
        self.match_row = None
        self.scrolled_away = False
        self.scroll_end(animate=False, immediate=True, x_axis=False)
        self._update_title()

    def action_cycle_level(self) -> None:
        self.level_filter = LEVEL_FILTERS[(LEVEL_FILTERS.index(self.level_filter) + 1) % len(LEVEL_FILTERS)]
        self.post_message(self.FilterChanged())

    def action_cycle_lane(self) -> None:
        options: list[Optional[str]] = [None, *self.lanes]
        current = options.index(self.lane_filter) if self.lane_filter in options else 0
        self.lane_filter = options[(current + 1) % len(options)]
        self.post_message(self.FilterChanged())
