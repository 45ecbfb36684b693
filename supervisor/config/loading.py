"""Loading: TOML → `SGLSUP_*` environment overrides → validated `Config`, every problem as a `FieldError`.

`load_config(path)` raises `ConfigError` listing every problem with its dotted field path, the value
and what is allowed. Overrides come from `SGLSUP_<SECTION>__<KEY>...` environment variables.
"""

from __future__ import annotations

import copy
import os
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from supervisor.config.checks import check_config
from supervisor.config.errors import ConfigError, FieldError
from supervisor.config.models import Config

ENV_PREFIX = "SGLSUP_"


def load_config(path: str | Path, env: Mapping[str, str] = os.environ) -> Config:
    """Read, override from `SGLSUP_*` variables in `env`, validate; raises ConfigError."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([FieldError(str(path), None, f"a readable UTF-8 file ({exc})")]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([FieldError(str(path), None, f"valid TOML ({exc})")]) from exc
    return parse_config(data, base_dir=path.parent, env=env)


def parse_config(data: Mapping[str, Any], base_dir: Path, env: Mapping[str, str]) -> Config:
    """Validate a decoded TOML document; relative paths are resolved against `base_dir`."""
    data, errors = apply_env_overrides(data, env)
    if errors:
        raise ConfigError(errors)
    try:
        config = Config.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError([_field_error(e) for e in exc.errors()]) from None
    errors = check_config(config, env)
    if errors:
        raise ConfigError(errors)
    return config


def apply_env_overrides(
    data: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], list[FieldError]]:
    """Apply `SGLSUP_SECTION__KEY[__KEY...]=VALUE` overrides (VALUE read as a TOML value, else a string).

    Keys are case-insensitive; a `servers` element is named by index or by `name`. Variables with the
    prefix that do not start with a section (`supervisor`, `servers`, `alerts`) are ignored.
    """
    doc = copy.deepcopy(dict(data))
    errors: list[FieldError] = []
    for var in sorted(k for k in env if k.startswith(ENV_PREFIX)):
        keys = var[len(ENV_PREFIX) :].lower().split("__")
        if len(keys) < 2 or keys[0] not in Config.model_fields:
            continue
        node: Any = doc
        for i, key in enumerate(keys[:-1]):
            node = _child(node, key)
            if node is None:
                errors.append(FieldError(f"env {var}", env[var], f"no element {'.'.join(keys[: i + 1])}"))
                break
        else:
            try:
                node[keys[-1]] = tomllib.loads(f"v = {env[var]}")["v"]
            except tomllib.TOMLDecodeError:
                node[keys[-1]] = env[var]
    return doc, errors


def _child(node: Any, key: str) -> Any:
    if isinstance(node, list):
        if key.isdigit():
            return node[int(key)] if int(key) < len(node) and isinstance(node[int(key)], dict) else None
        return next((e for e in node if isinstance(e, dict) and e.get("name") == key), None)
    if not isinstance(node, dict):
        return None
    if key not in node:
        node[key] = [] if key == "servers" else {}
    return node[key]


def _field_error(err: Mapping[str, Any]) -> FieldError:
    loc = tuple(err["loc"])
    path = _dotted(loc)
    value = "<redacted>" if ".env." in f"{path}." else err.get("input")
    if err["type"] == "missing":
        value = "(missing)"
    allowed = str(err["msg"])
    if err["type"] == "extra_forbidden":
        allowed = f"unknown key; known keys: {', '.join(_known_keys(loc[:-1]))}"
    return FieldError(path, value, allowed)


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _known_keys(loc: Sequence[str | int]) -> list[str]:
    model: type[BaseModel] | None = Config
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field else None
    return sorted(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) in (tuple, typing.Union):
        return next((m for a in typing.get_args(annotation) if (m := _model_in(a))), None)
    return None
