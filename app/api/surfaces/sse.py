"""Named-event SSE streams (`event: <type>` + `data: {…}`), as the Responses and Messages APIs send them."""

from __future__ import annotations

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


def model_markers(served: str, public: str) -> tuple[bytes, bytes]:
    """The byte patterns of the served and the public model name, as compact JSON writes them."""
    return b'"model":"' + served.encode() + b'"', b'"model":"' + public.encode() + b'"'
