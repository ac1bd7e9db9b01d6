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
    def draw(self, view: RunView, width: int):
        return render.header_text(view, width)


class LoadPanel(ViewPanel):
    """The loading bars; before them, while the job validates, the preflight's checklist."""

    BORDER_TITLE = "loading"

    def draw(self, view: RunView, width: int):
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
        self.border_title = self.BORDER_TITLE

    def show(self, view: RunView) -> None:
        if view.failures == self.failures:
            return
        keep = self.highlighted
        # The highlight stays on its failure (a provisional one refined in place keeps its ident), else its row.
        kept = self.failures[keep].ident if self.failures and keep is not None and keep < len(self.failures) else None
        self.failures = view.failures
        width = max(20, self.content_size.width or 60)
        if view.failures:
            self.set_options([Option(render.failure_label(f, width), id=str(f.position)) for f in view.failures])
            same = next((i for i, f in enumerate(view.failures) if kept and f.ident == kept), None)
            self.highlighted = same if same is not None else keep if keep is not None and keep < len(
                view.failures) else 0
            self.border_title = f"failures ({len(view.failures)}) · Enter: traceback"
            self.add_class("has-failures")
        else:
            self.set_options([Option("no failures", disabled=True)])
            self.border_title = self.BORDER_TITLE
            self.remove_class("has-failures")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        index = event.option_index
        if self.failures and 0 <= index < len(self.failures):
            self.post_message(self.Open(self.failures[index]))


class LogPanel(RichLog):
    """The live log: \\r bars collapsed, lanes coloured, filtered by lane and level, searchable.

    It is handed new lines (the model's tail) and keeps at most ``max_lines`` on screen; filters and search
    redraw from the model's tail, which the screen passes in.
    """

    ALLOW_MAXIMIZE = True
    BINDINGS = [
        Binding("v", "cycle_level", "level"),
        Binding("n", "cycle_lane", "lane"),
    ]

    class FilterChanged(Message):
        pass

    def __init__(self, *args, max_lines: int = 2000, **kwargs) -> None:
        super().__init__(*args, max_lines=max_lines, wrap=False, markup=False, highlight=False, **kwargs)
        self.level_filter = "all"
        self.lane_filter: Optional[str] = None
        self.search: Optional[str] = None
        self.lanes: tuple[str, ...] = ()
        self.last_seq = 0
        self.shown = 0
        self._update_title()

    def _update_title(self) -> None:
        parts = [f"log · level {self.level_filter} (v)", f"lane {safe_text(self.lane_filter or 'all')} (n)"]
        if self.search:
            parts.append(f"search “{safe_text(self.search)}”")
        # Rich Text, not a markup string: a search for "[/]" or a lane named "[b]" is text, not a markup error.
        self.border_title = Text(" · ".join(parts))

    def accepts(self, line: LogLine) -> bool:
        if self.lane_filter is not None and line.lane != self.lane_filter:
            return False
        if _LEVEL_RANK.get(line.level, 1) < _FILTER_MIN[self.level_filter]:
            return False
        if self.search and self.search.lower() not in safe_text(line.text, "\t").lower():  # as it is shown
            return False
        return True

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
            # One write for the batch: half the cost of a write per line, and the UI thread is shared with
            # everything else that has to reach the screen.
            self.write(Text("\n", no_wrap=True).join(render.log_line_text(line, search=self.search)
                                                     for line in picked), scroll_end=False)
            self.shown += len(picked)
            if self.auto_scroll:
                self.scroll_end(animate=False, immediate=False, x_axis=False)

    def redraw(self, lines: list[LogLine]) -> None:
        self.clear()
        self.shown = 0
        self.last_seq = 0
        self._update_title()
        self.add_lines(lines)

    def set_search(self, text: Optional[str]) -> None:
        self.search = text or None
        self.post_message(self.FilterChanged())

    def action_cycle_level(self) -> None:
        self.level_filter = LEVEL_FILTERS[(LEVEL_FILTERS.index(self.level_filter) + 1) % len(LEVEL_FILTERS)]
        self.post_message(self.FilterChanged())

    def action_cycle_lane(self) -> None:
        options: list[Optional[str]] = [None, *self.lanes]
        current = options.index(self.lane_filter) if self.lane_filter in options else 0
        self.lane_filter = options[(current + 1) % len(options)]
        self.post_message(self.FilterChanged())
