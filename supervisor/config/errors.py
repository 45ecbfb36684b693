"""What a configuration problem looks like: a dotted field path, the value, what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem: the dotted path (`servers[0].probes.health_timeout_s`), the value, what is allowed."""

    path: str
    value: object
    allowed: str

    def __str__(self) -> str:
        return f"{self.path}: got {self.value!r}; {self.allowed}"


class ConfigError(Exception):
    """The configuration is invalid; `errors` lists every problem found."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__(self.format_errors())

    def format_errors(self) -> str:
        """One line per error."""
        return "\n".join(str(e) for e in self.errors)
