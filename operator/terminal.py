"""Strings from engines and manifests, made safe to show on a terminal.

Why this module exists: the human-readable views (``reptables status``, the lines ``reptables up``
prints, ``kubectl reptables``, ``reptables stream``'s messages) show names, paths, messages and
errors that come from manifests and engines, and a table path may hold any character but
whitespace (``//tmp/a\\x1b[31mred\\x1b]0;title\\x07`` is a valid path). Written raw, such a string
drives the terminal: it recolours the screen, retitles the window, moves the cursor to overwrite
lines above, or reorders text with Unicode bidi overrides so that it reads differently from what it
is. :func:`display` is the one place that decides what is escaped; every text view passes the
strings it did not write itself through it. Machine output (``-o json``/``-o yaml``, the JSON lines
of ``reptables stream``) stays exact and never goes through here.

What is escaped: control characters (Unicode category Cc: C0, DEL, C1) as ``\\xNN``; format
characters (Cf: bidi overrides and isolates, zero-width characters, the soft hyphen, BOMs) and
lone surrogates (Cs) as ``\\uNNNN`` (``\\UNNNNNNNN`` beyond the BMP); the line and paragraph
separators U+2028/U+2029 too, since some viewers break lines at them. A backslash is left as it is,
so a name that holds the text ``\\x1b`` looks like one that holds the character: the view is for
reading, and the exact string is in ``-o json``.
"""

from __future__ import annotations

import unicodedata

__all__ = ["display"]

#: the categories escaped: control, format, surrogate, line and paragraph separator
_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def display(text: object, *, multiline: bool = False) -> str:
    """``str(text)`` with every character that could drive a terminal escaped (the module docstring
    says which); idempotent. ``multiline`` keeps line feeds, for text shown as several lines (a log
    tail); everywhere else a line feed is escaped too, so a name cannot start a line of its own."""
    text = str(text)
    if text.isprintable():  # the common case: nothing but printable characters and spaces
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _ESCAPED and not (multiline and c == "\n") else c
                   for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
