"""systemd's rules for the words of a unit setting, as systemd.syntax(7) and systemd.service(5) state them.

Pure string functions:
- `split_words`: quoting (a `"…"` or `'…'` section anywhere in a word, quotes removed), C escapes (`\\n`,
  `\\s`, `\\x41`, `\\101`, `\\u00e9`, …; backslashes escape inside both kinds of quotes), whitespace between words.
  An unknown escape is kept verbatim with a warning (systemd retries the word that way); unbalanced quotes make
  the whole setting invalid (systemd ignores it, and so do we: `UnitSyntaxError`).
- `split_exec`: one `ExecStart=` value: the `-`, `@`, `:`, `+`, `!`/`!!` prefixes of the executable, `;` between
  command lines, `\\;` for a literal `;`.
- `expand_argv`: the variable substitution systemd applies when it starts the command: `$NAME` as a word of its
  own becomes the value split at whitespace (quotes respected, then removed), `${NAME}` anywhere in a word the
  exact value, `$$` a `$`; an unset variable expands to nothing.
- `expand_specifiers`: `%%` and the `%` specifiers that are fixed for a system unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

WHITESPACE = " \t\n\r"
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_OCTAL = "01234567"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Specifiers whose value is fixed for a unit of the system manager (systemd.unit(5), "Specifiers").
_FIXED_SPECIFIERS = {
    "%": "%",
    "E": "/etc",
    "L": "/var/log",
    "S": "/var/lib",
    "C": "/var/cache",
    "t": "/run",
    "T": "/tmp",
    "V": "/var/tmp",
}


class UnitSyntaxError(ValueError):
    """A setting systemd itself would refuse (it logs the error and ignores the setting)."""


@dataclass
class Words:
    """The words of one setting and the warnings systemd would log about them."""

    words: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _unescape_one(text: str, i: int) -> tuple[str, int] | None:
    """The character the escape whose letter is at `text[i]` stands for, and how many characters it spans."""
    c = text[i]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], 1
    if c in _HEX_ESCAPES:
        digits = text[i + 1 : i + 1 + _HEX_ESCAPES[c]]
        if len(digits) != _HEX_ESCAPES[c] or not all(d in "0123456789abcdefABCDEF" for d in digits):
            return None
        code = int(digits, 16)
        if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            return None
        return chr(code), 1 + len(digits)
    if c in _OCTAL:
        digits = text[i : i + 3]
        if len(digits) != 3 or not all(d in _OCTAL for d in digits):
            return None
        code = int(digits, 8)
        return (chr(code), 3) if 0 < code <= 255 else None
    return None


def _first_word(
    text: str, pos: int, out: Words, *, cunescape: bool = True, relax: bool = False
) -> tuple[str | None, int]:
    """systemd's `extract_first_word` with unquoting (and C unescaping unless `cunescape` is off): the word
    starting at or after `pos` (None at the end) and where the next one may start. `relax` ends an unclosed
    quote at the end of the text instead of refusing it."""
    n = len(text)
    while pos < n and text[pos] in WHITESPACE:
        pos += 1
    if pos >= n:
        return None, n
    word: list[str] = []
    quote = ""
    while pos < n:
        c = text[pos]
        if c == "\\":
            if pos + 1 >= n:
                if quote and not relax:
                    raise UnitSyntaxError(f"unbalanced quoting in {text!r}")
                word.append("\\")  # a trailing backslash is kept (systemd's relaxed retry)
                return "".join(word), n
            if not cunescape:
                word.append(text[pos + 1])
                pos += 2
                continue
            found = _unescape_one(text, pos + 1)
            if found is None:
                out.warnings.append(f"unknown escape sequence \\{text[pos + 1]} kept as written")
                word.append("\\" + text[pos + 1])
                pos += 2
            else:
                word.append(found[0])
                pos += 1 + found[1]
            continue
        if quote:
            if c == quote:
                quote = ""
            else:
                word.append(c)
            pos += 1
            continue
        if c in "'\"":
            quote = c
            pos += 1
            continue
        if c in WHITESPACE:
            break
        word.append(c)
        pos += 1
    if quote and not relax:
        raise UnitSyntaxError(f"unbalanced quoting in {text!r}")
    while pos < n and text[pos] in WHITESPACE:
        pos += 1
    return "".join(word), pos


def split_words(text: str, *, cunescape: bool = True, relax: bool = False) -> Words:
    """Every word of `text`, unquoted and unescaped as systemd does for a setting that allows quoting."""
    out = Words()
    pos = 0
    while True:
        word, pos = _first_word(text, pos, out, cunescape=cunescape, relax=relax)
        if word is None:
            return out
        out.words.append(word)


@dataclass(frozen=True)
class ExecCommand:
    """One command line of `ExecStart=`: the executable, the argv it gets (argv[0] first) and its prefixes."""

    path: str
    argv: tuple[str, ...]
    prefixes: str
    warnings: tuple[str, ...] = ()

    @property
    def expands_variables(self) -> bool:
        """False with the `:` prefix, which turns variable substitution off."""
        return ":" not in self.prefixes


def _is_separator(text: str, pos: int, token: str) -> bool:
    end = pos + len(token)
    return text.startswith(token, pos) and (end >= len(text) or text[end] in WHITESPACE)


def split_exec(value: str) -> list[ExecCommand]:
    """The command lines of one `ExecStart=` value (systemd.service(5), "Command lines")."""
    commands: list[ExecCommand] = []
    pos = 0
    while True:
        out = Words()
        first, pos = _first_word(value, pos, out)
        if first is None:
            return commands
        body = first.lstrip("-@:+!|")
        prefixes = first[: len(first) - len(body)]
        if "|" in prefixes:
            raise UnitSyntaxError(
                "ExecStart=| runs the command through a shell: give the SGLang command after `--` instead"
            )
        if not body:
            raise UnitSyntaxError(f"empty executable in ExecStart={value!r}")
        if "/" in body and not body.startswith("/"):
            raise UnitSyntaxError(f"{body!r} is neither an absolute path nor a plain file name")
        argv: list[str] = [] if "@" in prefixes else [body]
        while pos < len(value):
            if _is_separator(value, pos, ";"):
                pos += 1
                break
            if _is_separator(value, pos, "\\;"):
                argv.append(";")
                pos += 2
                while pos < len(value) and value[pos] in WHITESPACE:
                    pos += 1
                continue
            word, pos = _first_word(value, pos, out)
            if word is None:
                break
            argv.append(word)
        if not argv:
            raise UnitSyntaxError(f"ExecStart=@{body} needs the argv[0] word after the executable")
        commands.append(ExecCommand(body, tuple(argv), prefixes, tuple(out.warnings)))
        while pos < len(value) and value[pos] in WHITESPACE:
            pos += 1


def _replace_braced(word: str, env: dict[str, str], unset: set[str]) -> str:
    """`${NAME}` replaced by its value ("" when unset), `$$` by `$`; any other `$` kept."""
    out: list[str] = []
    i = 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("${", i) and "}" in word[i + 2 :]:
            end = word.index("}", i + 2)
            name = word[i + 2 : end]
            if name not in env:
                unset.add(name)
            out.append(env.get(name, ""))
            i = end + 1
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def expand_argv(argv: tuple[str, ...], env: dict[str, str], unset: set[str]) -> list[str]:
    """The argv after systemd's variable substitution; the names that were unset are added to `unset`.

    argv[0] (the program's name) is not expanded: systemd forbids a variable there.
    """
    out = list(argv[:1])
    for word in argv[1:]:
        if word.startswith("$") and word[1:2] not in ("{", "$"):
            name = word[1:]
            if name in env:
                out += split_words(env[name], cunescape=False, relax=True).words
            else:
                unset.add(name)
            continue
        out.append(_replace_braced(word, env, unset))
    return out


def expand_specifiers(text: str, unit: str, warnings: list[str]) -> str:
    """`%` specifiers of a system unit named `unit` (e.g. `sglang@kimi.service`) expanded; one the import
    cannot know (the host, a user's home) is kept as written, with a warning."""
    stem, _, _suffix = unit.rpartition(".")
    prefix, at, instance = stem.partition("@")
    known = {
        **_FIXED_SPECIFIERS,
        "n": unit,
        "N": stem,
        "p": prefix,
        "P": prefix,
        "i": instance if at else "",
        "I": instance if at else "",
    }
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "%" and i + 1 < len(text):
            letter = text[i + 1]
            if letter in known:
                out.append(known[letter])
            else:
                warnings.append(f"specifier %{letter} kept as written (its value is known only to systemd)")
                out.append(text[i : i + 2])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def is_env_name(name: str) -> bool:
    """A variable name systemd accepts: letters, digits and `_`, not starting with a digit."""
    return bool(_NAME.match(name))
