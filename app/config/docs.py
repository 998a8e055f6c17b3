"""docs/config.md from the schema: every key with its path, type, default and description (`Field(description=…)`).

    python -m app.config.docs            # rewrite docs/config.md
    python -m app.config.docs --check    # exit 1 when docs/config.md is not what the schema says

tests/test_config_docs.py runs the check, so a key added without regenerating fails the fast tier.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from app.config.models import GatewayConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"
REGENERATE = "python -m app.config.docs"

_INTRO = f"""# Configuration reference

<!-- Generated from the schema (app/config/models.py and the models it mounts) by `{REGENERATE}`.
     Do not edit by hand: tests/test_config_docs.py fails when this file is not what the schema says. -->

The gateway reads one YAML file: `kvgate serve --config PATH`, else the file `KVGATE_CONFIG` names, else the
embedded default (`config/local.yaml`). Every key can be overridden from the environment as
`KVGATE_<KEY>__<SUBKEY>` (`KVGATE_STORE__URL=redis://127.0.0.1:6379/0`, `KVGATE_POOLS__FAST__SERVED_MODEL=m`);
a variable wins over the file key by key. The value of a list or object key (`KVGATE_MODELS`, `KVGATE_TENANTS`,
`KVGATE_POOLS__FAST__REPLICAS`) is JSON or YAML flow text: `[{{"name": "m", "pools": ["fast"]}}]` and
`[{{name: m, pools: [fast]}}]` both work; a value that is neither is reported with the variable's name. An empty
variable counts as unset; `null` sets a key to none. List items cannot be addressed one by one (`KVGATE_TENANTS`
replaces the whole list).

`kvgate check-config [PATH]` prints every problem with its key path (`pools.fast.replicas[0]: not a URL`) and
exits 2; `kvgate serve` refuses a bad config the same way. An unknown key is an error, not ignored (in the file,
and below a top-level key in a variable: `KVGATE_LISTEN__PROT`); a variable whose first part names no top-level
key is not the gateway's (the scripts' `KVGATE_FAST_PORT`, `KVGATE_CACHE`) and is left alone.

In the paths below, `<name>` is a key you choose (a pool's name) and `[]` an item of a list.
"""


@dataclass(frozen=True, slots=True)
class Key:
    """One documented key: a leaf (a value) or a block (an object, a list of them, a map of them)."""

    path: str
    type: str
    default: str
    description: str
    leaf: bool
    variant: str = ""  # the policy type a key belongs to (keys of a discriminated union)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    return [a for a in _union_members(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]


def _union_members(annotation: Any) -> list[Any]:
    annotation = _strip_annotated(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in _union_members(a)]
    return [annotation]


def _strip_annotated(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _type_name(annotation: Any) -> str:
    annotation = _strip_annotated(annotation)
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(annotation))
    if origin in (Union, types.UnionType):
        members = get_args(annotation)
        names = [_type_name(m) for m in members if m is not type(None)]
        return " \\| ".join(names) + (" \\| `null`" if type(None) in members else "")
    if origin is list:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if origin is dict:
        return f"map of name to {_type_name(get_args(annotation)[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return {str: "string", int: "int", float: "number", bool: "bool"}.get(annotation, str(annotation))


def _constraints(info: FieldInfo) -> str:
    out = []
    for m in info.metadata:
        for cls, attr, sign in ((at.Ge, "ge", "≥"), (at.Gt, "gt", ">"), (at.Le, "le", "≤"), (at.Lt, "lt", "<")):
            if isinstance(m, cls):
                out.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, at.MinLen) and m.min_length:
            out.append(f"at least {m.min_length}")
    return f" ({', '.join(out)})" if out else ""


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return ""
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def keys(model: type[BaseModel], prefix: str = "", variant: str = "") -> Iterator[Key]:
    """Every key of `model` under `prefix`, depth first in the schema's order (blocks before their keys)."""
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        annotation = _strip_annotated(info.annotation)
        origin = get_origin(annotation)
        description = info.description or ""
        if origin is list and _models_in(get_args(annotation)[0]):
            yield Key(path, "list of objects", _default(info), description, False, variant)
            yield from keys(_models_in(get_args(annotation)[0])[0], f"{path}[]", variant)
        elif origin is dict and _models_in(get_args(annotation)[1]):
            yield Key(path, "map of name to object", _default(info), description, False, variant)
            yield from keys(_models_in(get_args(annotation)[1])[0], f"{path}.<name>", variant)
        elif (models := _models_in(annotation)) and len(models) > 1:  # a discriminated union: the policy
            names = [m.model_fields["type"].default for m in models]
            union = " \\| ".join(f"`{n}`" for n in names) + " \\| object \\| `null`"
            yield Key(path, union, _default(info), description, False, variant)
            for m, n in zip(models, names, strict=True):
                yield from keys(m, path, n)
        elif models:
            kind = "object \\| `null`" if type(None) in _union_members(annotation) else "object"
            yield Key(path, kind, _default(info), description, False, variant)
            yield from keys(models[0], path, variant)
        elif variant and name == "type":
            continue  # the union's row names the types
        else:
            yield Key(path, _type_name(annotation) + _constraints(info), _default(info), description, True, variant)


def render() -> str:
    """docs/config.md's text."""
    out = [_INTRO]
    for name, info in GatewayConfig.model_fields.items():
        out.append(f"\n## `{name}`\n\n{_cell(info.description or '')}\n")
        out.append("| Key | Type | Default | Description |\n|---|---|---|---|")
        for k in keys(GatewayConfig):
            if k.path != name and not k.path.startswith((f"{name}.", f"{name}[]")):
                continue
            key = f"`{k.path}`" if k.leaf else f"**`{k.path}`**"
            what = f"*(`{k.variant}`)* {k.description}" if k.variant else k.description
            out.append(f"| {key} | {k.type} | {k.default} | {_cell(what)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/config.md, or with --check say whether it is up to date."""
    parser = argparse.ArgumentParser(prog="python -m app.config.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date with the schema; regenerate it: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
