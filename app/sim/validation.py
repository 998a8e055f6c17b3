"""Request-body type checks with the 400 vLLM's FastAPI layer sends for a pydantic RequestValidationError.

vLLM answers these in the OpenAI envelope on every path, /v1/messages included (its Anthropic envelope only wraps
errors the handler returns): `{"error": {"message": "N validation error(s):\\n  {...}", "type": "Bad Request",
"param": "body.<field>", "code": 400}}`.
"""

from __future__ import annotations

from typing import Any

from app.sim.protocol import SimHTTPError

_MAX_INPUT_CHARS = 200


def _summary(value: Any) -> Any:
    """vLLM's size-bounded stand-in for an error's `input` (containers are described, not rendered)."""
    if isinstance(value, str):
        return value[:_MAX_INPUT_CHARS] + "...[truncated]" if len(value) > _MAX_INPUT_CHARS else value
    if isinstance(value, list | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


class _Repr(str):
    """A string printed bare inside a dict's repr (as the exception object pydantic puts in ctx is)."""

    def __repr__(self) -> str:
        return str(self)


class BodyErrors:
    """Collects field errors like pydantic does (all of them), then raises one SimHTTPError."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.errors: list[dict[str, Any]] = []

    def add(self, kind: str, loc: str, msg: str, value: Any) -> None:
        """Record one error at `body.<loc>`."""
        self.errors.append({"type": kind, "loc": f"body.{loc}", "msg": msg, "input": _summary(value)})

    def value_error(self, loc: str, message: str, value: Any) -> None:
        """A field validator raised ValueError(message): pydantic keeps the exception under ctx."""
        self.errors.append(
            {
                "type": "value_error",
                "loc": f"body.{loc}",
                "msg": f"Value error, {message}",
                "input": _summary(value),
                "ctx": {"error": _Repr(f"ValueError({message!r})")},
            }
        )

    def missing(self, loc: str) -> None:
        """A required field is absent."""
        self.add("missing", loc, "Field required", self.body)

    def raise_if_any(self) -> None:
        """Raise the 400 if anything was recorded."""
        if not self.errors:
            return
        n = len(self.errors)
        text = f"{n} validation {'error' if n == 1 else 'errors'}:\n" + "".join(f"  {e}\n" for e in self.errors[:10])
        raise SimHTTPError(400, text.rstrip(), "Bad Request", self.errors[0]["loc"])

    # ---------------------------------------------------------------- typed getters (lax, as pydantic is)
    def int_(self, name: str, default: int | None = None, *, required: bool = False) -> int | None:
        """An optional integer field (numeric strings and integral floats accepted)."""
        if name not in self.body:
            if required:
                self.missing(name)
            return default
        v = self.body[name]
        if v is None and not required:
            return default
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            if v.is_integer():
                return int(v)
            self.add("int_from_float", name, "Input should be a valid integer, got a number with a fractional part", v)
            return default
        if isinstance(v, str):
            try:
                return int(v.strip())
            except ValueError:
                self.add(
                    "int_parsing", name, "Input should be a valid integer, unable to parse string as an integer", v
                )
                return default
        self.add("int_type", name, "Input should be a valid integer", v)
        return default

    def float_(self, name: str) -> float | None:
        """An optional number field."""
        v = self.body.get(name)
        if v is None:
            return None
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                self.add("float_parsing", name, "Input should be a valid number, unable to parse string as a number", v)
                return None
        self.add("float_type", name, "Input should be a valid number", v)
        return None

    def bool_(self, name: str, default: bool = False) -> bool:
        """An optional boolean field (pydantic's accepted spellings)."""
        v = self.body.get(name)
        if v is None:
            return default
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        if isinstance(v, str) and v.lower() in (
            "0",
            "off",
            "f",
            "false",
            "n",
            "no",
            "1",
            "on",
            "t",
            "true",
            "y",
            "yes",
        ):
            return v.lower() in ("1", "on", "t", "true", "y", "yes")
        self.add(
            "bool_parsing" if isinstance(v, str) else "bool_type",
            name,
            "Input should be a valid boolean" + (", unable to interpret input" if isinstance(v, str) else ""),
            v,
        )
        return default

    def str_(self, name: str, *, required: bool = False) -> str | None:
        """An optional (or required) string field."""
        if name not in self.body or (self.body[name] is None and not required):
            if required:
                self.missing(name)
            return None
        v = self.body[name]
        if not isinstance(v, str):
            self.add("string_type", name, "Input should be a valid string", v)
            return None
        return v

    def list_(self, name: str, *, required: bool = False) -> list[Any] | None:
        """An optional (or required) list field."""
        if name not in self.body or (self.body[name] is None and not required):
            if required:
                self.missing(name)
            return None
        v = self.body[name]
        if not isinstance(v, list):
            self.add("list_type", name, "Input should be a valid list", v)
            return None
        return v
