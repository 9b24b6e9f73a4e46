"""A small TOML writer for the plain data fedsbdt writes (plans): tables, arrays of tables, scalars, lists.

The standard library reads TOML (``tomllib``) but does not write it.  This
writer covers exactly what :mod:`fedsbdt.common.federation.plan` produces — nested dicts of
strings, integers, finite floats, booleans and lists of those, plus lists of
dicts as arrays of tables — and refuses anything else, so what it writes
always reads back to the same values.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class TomlWriteError(ValueError):
    pass


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else json.dumps(k, ensure_ascii=False)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise TomlWriteError(f"TOML has no representation for {v!r} in fedsbdt files")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        if any(isinstance(x, dict) for x in v):
            raise TomlWriteError("inline arrays of tables are not supported")
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    raise TomlWriteError(f"cannot write a {type(v).__name__} as TOML")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def _emit(d: dict[str, Any], path: list[str], out: list[str]) -> None:
    for k, v in d.items():
        if v is None:
            continue  # TOML has no null: absent means "default"
        if not isinstance(v, dict) and not _is_table_array(v):
            out.append(f"{_key(k)} = {_scalar(v)}")
    for k, v in d.items():
        if isinstance(v, dict):
            out.append("")
            out.append("[" + ".".join(_key(p) for p in path + [k]) + "]")
            _emit(v, path + [k], out)
        elif _is_table_array(v):
            for item in v:
                out.append("")
                out.append("[[" + ".".join(_key(p) for p in path + [k]) + "]]")
                _emit(item, path + [k], out)


def dumps(d: dict[str, Any], header: str = "") -> str:
    """TOML text for ``d`` (``None`` values are omitted), optionally preceded by ``#`` comment lines."""
    out: list[str] = [f"# {line}" if line else "#" for line in header.splitlines()]
    _emit(d, [], out)
    return "\n".join(out).lstrip("\n") + "\n"
