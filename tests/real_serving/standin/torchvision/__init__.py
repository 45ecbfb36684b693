"""A stand-in for torchvision in the real-serving venv (no CPU torchvision wheel fits the pinned CPU torch).

SGLang's config package and transformers' image utilities import `torchvision.*` at import time; text-only
serving never uses it. Every `torchvision.<anything>` import succeeds; `InterpolationMode` is a real enum;
every other name is a class that raises when it is called, instantiated or subclassed-and-used.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.29.1"


class InterpolationMode(enum.Enum):
    """The names transformers reads at import time."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Unavailable:
    """Any torchvision object: using it raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("torchvision is a stand-in in this venv: image features are unavailable")

    def __class_getitem__(cls, item: Any) -> type:
        return cls


def _missing(module: str, name: str) -> Any:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if name == "InterpolationMode":
        return InterpolationMode
    return type(name, (_Unavailable,), {"__module__": module})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        value = _missing(self.__name__, name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every `torchvision.*` submodule and makes it a stand-in package."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def __getattr__(name: str) -> Any:
    return _missing(__name__, name)


sys.meta_path.insert(0, _Finder())
