"""The log pane in parts (after Toolong's log view): a pure line buffer (buffer.py), the
row layout (layout.py), markers (markers.py), styles (styles.py), the filter prompt
(filter_input.py) and the thin widget over them (view.py)."""

from samai.widgets.logview.buffer import LineBuffer, LineFilter, LinesView, clean_line
from samai.widgets.logview.filter_input import PROMPT_ROWS, LogFilterInput
from samai.widgets.logview.markers import ALARMS
from samai.widgets.logview.view import DEFAULT_MAX_LINES, FLUSH_INTERVAL, LogView

__all__ = ["ALARMS", "DEFAULT_MAX_LINES", "FLUSH_INTERVAL", "PROMPT_ROWS", "LineBuffer", "LineFilter",
           "LinesView", "LogFilterInput", "LogView", "clean_line"]
