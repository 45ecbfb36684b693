"""Which command lines start SGLang: a Python launcher with `-m MODULE`, or the SGLang CLI's `sglang serve`.

A Python launcher is the interpreter (with its own options) and `-m MODULE` (`sglang.launch_server`,
`sglang_router.launch_router`, the bundled `simulator.launch_server`); the SGLang CLI is `sglang serve`; any other
program (a wrapper script) is the command alone.
"""

from __future__ import annotations

import re

from policies.pd import Role

LAUNCH_MODULES = {
    "sglang.launch_server": Role.UNIFIED,
    "simulator.launch_server": Role.UNIFIED,
    "sglang_router.launch_router": Role.ROUTER,
}
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def split_command(words: list[str]) -> tuple[list[str], list[str], Role | None]:
    """(command, args, the role the launcher implies or None when it is not an SGLang launcher)."""
    program = words[0].rsplit("/", 1)[-1]
    if _PYTHON.match(program) and "-m" in words:
        at = words.index("-m")
        if at + 1 < len(words):
            return words[: at + 2], words[at + 2 :], LAUNCH_MODULES.get(words[at + 1])
    if program == "sglang" and words[1:2] == ["serve"]:
        return words[:2], words[2:], Role.UNIFIED
    return words[:1], words[1:], None
