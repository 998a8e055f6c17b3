"""Named-event SSE streams (`event: <type>` + `data: {…}`), as the Responses and Messages APIs send them."""

from __future__ import annotations

import re
import time
from typing import Any

import orjson

from app.surfaces.exchange import Exchange


def event_parts(event: bytes) -> tuple[bytes, bytes]:
    """The event name and the data payload of one SSE event (either may be empty)."""
    name = data = b""
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            name = line[6:].strip()
        elif line.startswith(b"data:"):
            data = line[5:].strip() if not data else data + b"\n" + line[5:].strip()
    return name, data


def event_doc(data: bytes) -> dict[str, Any] | None:
    """The JSON object an event carries, or None."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def named_event(name: str, doc: dict[str, Any]) -> bytes:
    """Serialize one named SSE event."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(doc) + b"\n\n"


def json_string(value: str) -> bytes:
    """`value` as a JSON string literal (quotes included), as orjson and vLLM write it."""
    return orjson.dumps(value)


class ModelRewrite:
    """Puts the public model name where an upstream wrote the served one, in any JSON spacing.

    vLLM writes compact JSON: the compact member is replaced without parsing, and an event that has it is
    taken as compact throughout. Only an event without it that still names the served model as a JSON string
    (spaced JSON, `"model" : "x"`) goes through a whitespace-tolerant pattern; the bytes around are kept.
    """

    __slots__ = ("_spaced", "public_marker", "public_value", "served_marker", "served_quoted")

    def __init__(self, served: str, public: str) -> None:
        self.served_quoted = json_string(served)
        self.public_value = json_string(public)
        self.served_marker, self.public_marker = b'"model":' + self.served_quoted, b'"model":' + self.public_value
        self._spaced: re.Pattern[bytes] | None = None  # compiled on first use: most streams never need it

    def apply(self, data: bytes) -> bytes:
        """`data` with every `"model": <served>` member naming the public model instead."""
        out = data.replace(self.served_marker, self.public_marker)
        # bytes.replace returns its own object when nothing matched: only then look for other spellings.
        return out if out is not data else self.spaced(data)

    def spaced(self, data: bytes) -> bytes:
        """The whitespace-tolerant rewrite, for an event with no compact `"model":<served>` member."""
        if self.served_quoted not in data:
            return data
        if self._spaced is None:
            self._spaced = re.compile(rb'"model"[ \t\r\n]*:[ \t\r\n]*' + re.escape(self.served_quoted))
        return self._spaced.sub(lambda _m: b'"model":' + self.public_value, data)


def model_markers(served: str, public: str) -> tuple[bytes, bytes]:
    """The byte patterns of the served and the public model name, as compact JSON writes them."""
    return b'"model":' + json_string(served), b'"model":' + json_string(public)


class NamedEventObserver:
    """What the Responses and Messages observers share: the model rewrite, token counting, the ending."""

    __slots__ = ("_ctx", "_model", "delivered", "done")

    def __init__(self, ctx: Exchange, served: str) -> None:
        self._ctx = ctx
        self._model = ModelRewrite(served, ctx.model) if served != ctx.model else None
        self.done = False
        self.delivered = 0

    def _token(self) -> None:
        """An event that carried generated content: counted; the first one stamps the first token."""
        self.delivered += 1
        if not self._ctx.timing.first_token:
            self._ctx.timing.first_token = time.perf_counter()

    def _relay(self, event: bytes) -> bytes:
        return self._model.apply(event) if self._model is not None else event

    def ending(self, trailer: bytes) -> bytes:
        """The trailer only: these streams end with their own final event, no [DONE]."""
        return trailer
