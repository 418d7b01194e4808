"""The one error type a spec can raise, and the source positions it points at."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """Spec text with the name it is reported under (a path, or `<string>`)."""

    text: str
    filename: str = "<string>"

    def lines(self) -> list[str]:
        """Lines as the parser counts them: split at \n only (a CRLF's \r dropped)."""
        return [line.removesuffix("\r") for line in self.text.split("\n")]

    def line(self, number: int) -> str:
        lines = self.lines()
        return lines[number - 1] if 1 <= number <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """1-based line/column of a node's first character, end exclusive."""

    line: int
    column: int
    end_line: int
    end_column: int


class SpecError(Exception):
    """A parse or check error: `file:line:col: message`, the line, a caret, a hint."""

    def __init__(self, message: str, source: Source | None = None, span: Span | None = None,
                 hint: str | None = None, show_line: bool = True):
        self.message = message
        self.source = source
        self.span = span
        self.hint = hint
        self.show_line = show_line  # False: a file that could not be read has no line to show
        super().__init__(self.render())

    @property
    def location(self) -> str:
        filename = self.source.filename if self.source else "<string>"
        if self.span is None:
            return filename
        return f"{filename}:{self.span.line}:{self.span.column}"

    def render(self) -> str:
        text = f"{self.location}: {self.message}"
        if self.source is not None and self.span is not None and self.show_line:
            line = self.source.line(self.span.line)
            width = 1
            if self.span.end_line == self.span.line:
                width = max(1, self.span.end_column - self.span.column)
            # keep tabs so the caret lines up under the same column as the text
            pad = "".join(c if c == "\t" else " " for c in line[: self.span.column - 1])
            text += f"\n    {line}\n    {pad}{'^' * width}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text
