"""The console every command writes through: text from the database shows, and does nothing.

Query texts, application names and the server's messages are anyone's who can connect to the
server: an ESC in one would recolour the operator's terminal, retitle its window, move its
cursor or write a hyperlink; a carriage return or backspace would rewrite what was shown.
Rich passes them through. So the one place where text becomes terminal output, this console,
writes each such character as its escape (`words.inert`): a plain string when it becomes rich
text (so tables measure what is shown), and every segment of text on its way out (rich's own
control segments, the cursor moves of a live view, stay as they are). Emoji codes stay text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

from pgscope.words import inert


class InertConsole(Console):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("emoji", False)  # `:name:` in a query is text, not a picture
        super().__init__(*args, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(inert(text), **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and segment.text:
                shown = inert(segment.text)
                if shown != segment.text:
                    segment = Segment(shown, segment.style)
            yield segment
