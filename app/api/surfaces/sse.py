"""Named-event SSE streams (`event: <type>` + `data: {…}`), as the Responses and Messages APIs send them."""

from __future__ import annotations

import re
from typing import Any

import orjson


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

    vLLM writes compact JSON: the compact marker is replaced without parsing. Only when the served name is
    still there as a JSON string afterwards (spaced JSON, `"model" : "x"`) does a whitespace-tolerant
    pattern run; the bytes around it are kept as they came.
    """

    __slots__ = ("_public_marker", "_public_value", "_served_marker", "_served_quoted", "_spaced")

    def __init__(self, served: str, public: str) -> None:
        self._served_quoted = json_string(served)
        self._public_value = json_string(public)
        self._served_marker, self._public_marker = b'"model":' + self._served_quoted, b'"model":' + self._public_value
        self._spaced = re.compile(rb'"model"[ \t\r\n]*:[ \t\r\n]*' + re.escape(self._served_quoted))

    def apply(self, data: bytes) -> bytes:
        """`data` with every `"model": <served>` member naming the public model instead."""
        out = data.replace(self._served_marker, self._public_marker)
        if self._served_quoted in out:
            out = self._spaced.sub(lambda _m: b'"model":' + self._public_value, out)
        return out


def model_markers(served: str, public: str) -> tuple[bytes, bytes]:
    """The byte patterns of the served and the public model name, as compact JSON writes them."""
    return b'"model":' + json_string(served), b'"model":' + json_string(public)


def only_null(data: bytes, key: bytes, null_marker: bytes) -> bool:
    """True when every occurrence of the JSON key `key` (quoted) is the compact `key:null` (or there is none).

    A False is only a reason to parse: a key name inside a string value can match too, never be missed.
    """
    i = data.find(key)
    while i >= 0:
        if not data.startswith(null_marker, i):
            return False
        i = data.find(key, i + len(null_marker))
    return True
