"""Reading a unit file and an environment file the way systemd reads them (systemd.syntax(7), systemd.exec(5)).

- Unit file: `[Section]` headers, `Key=Value` with the whitespace around `=` dropped, lines starting with `#` or
  `;` ignored, a line ending in an unescaped backslash joined to the next with the backslash replaced by a space
  (comment lines inside such a continuation are skipped).
- `EnvironmentFile=`: one `KEY=VALUE` a line; `#`/`;` comments and lines without `=` ignored; an unquoted value
  keeps interior whitespace and quotes after its first character, `\\` escapes the next character and a
  trailing `\\` continues the line; `'…'` takes everything verbatim (newlines too); `"…"` unescapes `\\"`,
  `\\\\`, `` \\` `` and `\\$`, keeps other backslashes, and a `\\` newline is a continuation. Invalid names are
  ignored (systemd logs and skips them).
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.importing.words import WHITESPACE, is_env_name

_COMMENTS = "#;"
_NEWLINE = "\n\r"
_SHELL_NEED_ESCAPE = '"\\`$'


@dataclass(frozen=True)
class Setting:
    """One `Key=Value` of a unit file, with where it was written."""

    section: str
    key: str
    value: str
    where: str  # "file:line"


def _ends_in_escape(line: str) -> bool:
    """True when `line` ends in a backslash that is not itself escaped."""
    escaped = False
    for c in line:
        escaped = not escaped if c == "\\" else False
    return escaped


def parse_unit(text: str, origin: str) -> list[Setting]:
    """Every setting of a unit file, in order."""
    settings: list[Setting] = []
    section = ""
    pending: str | None = None
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.lstrip(WHITESPACE)[:1] in tuple(_COMMENTS):
            continue
        line = raw if pending is None else pending + raw
        if pending is None:
            start = number
        if _ends_in_escape(line):
            pending = line[:-1] + " "
            continue
        pending = None
        section = _add_line(line.strip(WHITESPACE), section, f"{origin}:{start}", settings)
    if pending is not None:
        _add_line(pending.strip(WHITESPACE), section, f"{origin}:{start}", settings)
    return settings


def _add_line(line: str, section: str, where: str, settings: list[Setting]) -> str:
    """Record a `Key=Value` of `section`; returns the section in force after `line` (a header changes it)."""
    if line.startswith("[") and line.endswith("]"):
        return line[1:-1]
    key, eq, value = line.partition("=")
    if eq and key.strip(WHITESPACE):
        settings.append(Setting(section, key.strip(WHITESPACE), value.strip(WHITESPACE), where))
    return section


def parse_env_file(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The assignments of an `EnvironmentFile=` in order, and the lines systemd would ignore (as warnings)."""
    found: list[tuple[str, str]] = []
    ignored: list[str] = []
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    value_end: int | None = None  # where trailing whitespace of an unquoted value starts

    def push() -> None:
        name = "".join(key).rstrip(WHITESPACE)
        text = "".join(value if value_end is None else value[:value_end])
        if is_env_name(name):
            found.append((name, text))
        else:
            ignored.append(f"{name!r} is not a variable name; ignored as systemd ignores it")

    for c in text:
        if state == "pre_key":
            if c in _COMMENTS:
                state = "comment"
            elif c not in WHITESPACE:
                state, key, value, value_end = "key", [c], [], None
        elif state == "key":
            if c in _NEWLINE:
                state = "pre_key"
            elif c == "=":
                state = "pre_value"
            else:
                key.append(c)
        elif state == "pre_value":
            if c in _NEWLINE:
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in WHITESPACE:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in _NEWLINE:
                push()
                state = "pre_key"
            elif c == "\\":
                state, value_end = "value_escape", None
            else:
                if c not in WHITESPACE:
                    value_end = None
                elif value_end is None:
                    value_end = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in _NEWLINE:
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in _SHELL_NEED_ESCAPE:
                value.append(c)
            elif c != "\n":
                value += ["\\", c]
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in _NEWLINE:
                state = "pre_key"
        elif state == "comment_escape":
            state = "pre_key" if c in _NEWLINE else "comment"
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        push()
    return found, ignored
