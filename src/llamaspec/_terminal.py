"""What the command line writes to a terminal: streamed text with a live status line under it.

Three modes, chosen from what stdout and stderr are:

- stdout is a terminal: the text scrolls in all rows but the last (the terminal's scrolling region,
  as apt draws its progress bar) and the status line is redrawn in the last row;
- only stderr is a terminal (``llamaspec run ... > out.txt``): the status line is redrawn in place on
  stderr with a carriage return;
- neither: no status line, and no escape codes anywhere.

``close()`` gives the terminal back as it was (also after Ctrl-C: use it as a context manager).

The status is drawn by saving the cursor, writing the last row and restoring the cursor. A terminal
that does not save its pending wrap (pyte, some others) would then overwrite a character written in
the last column, so the class follows the text's column and draws the status only when the cursor
is not at the right edge.
"""

from __future__ import annotations

import os
import shutil
import sys
import unicodedata
from typing import TextIO


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (not a pipe or a file; TERM=dumb counts as not)."""
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


class StatusLine:
    """Streamed text on ``out`` and a one-line status below it (see the module docstring)."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        if is_terminal(self.out):
            self.mode = "region"
        elif is_terminal(self.err):
            self.mode = "stderr"
        else:
            self.mode = "off"
        self._rows = 0
        self._cols = 80
        self._col = 0  # the text's column as the terminal counts it (wide characters take two)
        self._shown = ""
        self._pending = ""
        self._open = False

    def __enter__(self) -> StatusLine:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Reserve the status row (terminal mode)."""
        if self.mode == "region" and not self._open:
            size = shutil.get_terminal_size()
            self._rows, self._cols = size.lines, size.columns
            if self._rows < 3:
                self.mode = "off"
                return
            # make room for the status row, then keep the text in rows 1..rows-1
            self.out.write("\n\x1b[1A\x1b7" + f"\x1b[1;{self._rows - 1}r" + "\x1b8")
            self.out.flush()
        self._open = True

    def write(self, text: str) -> None:
        """Append streamed text."""
        self.out.write(text)
        for ch in text:
            if ch in "\r\n":
                self._col = 0
            elif ch == "\t":
                self._col = (self._col // 8 + 1) * 8
            elif unicodedata.combining(ch) or ch < " ":
                continue
            else:
                self._col += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
        if self._pending and not self._at_edge():
            self._draw(self._pending)
        self.out.flush()

    def _at_edge(self) -> bool:
        return self._col > 0 and self._col % self._cols == 0

    def update(self, status: str) -> None:
        """Replace the status line."""
        if not self._open or self.mode == "off" or status == self._shown:
            return
        if self.mode == "region" and self._at_edge():
            self._pending = status  # drawn after the next text
            return
        self._draw(status)

    def _draw(self, status: str) -> None:
        self._shown, self._pending = status, ""
        width = shutil.get_terminal_size().columns
        line = status[: max(width - 1, 0)]
        if self.mode == "region":
            self.out.write(f"\x1b7\x1b[{self._rows};1H\x1b[2K\x1b[7m{line}\x1b[0m\x1b8")
            self.out.flush()
        else:
            self.err.write(f"\r\x1b[2K{line}")
            self.err.flush()

    def close(self) -> None:
        """Clear the status line and give the terminal back (the whole screen scrolls again)."""
        if not self._open:
            return
        self._open = False
        if self.mode == "region":
            self.out.write(f"\x1b7\x1b[{self._rows};1H\x1b[2K\x1b[r\x1b8")
            self.out.flush()
        elif self.mode == "stderr" and self._shown:
            self.err.write("\r\x1b[2K")
            self.err.flush()


class LoadBar:
    """A model's load progress as a bar on stderr (``Model(path, progress=LoadBar(path))``), drawn
    while stderr is a terminal and cleared when the load completes."""

    WIDTH = 30

    def __init__(self, what: str, err: TextIO | None = None) -> None:
        self.what = os.path.basename(what)
        self.err = err or sys.stderr
        self.live = is_terminal(self.err)
        self._shown = -1

    def __call__(self, share: float) -> bool:
        if not self.live:
            return True
        percent = int(share * 100)
        if percent != self._shown:
            self._shown = percent
            filled = int(share * self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.err.write(f"\r\x1b[2Kloading {self.what} [{bar}] {percent:3d}%")
            if share >= 1.0:
                self.err.write("\r\x1b[2K")
            self.err.flush()
        return True
