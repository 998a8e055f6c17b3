"""Where and how the RESP client connects: what a redis:// or unix:// URL says that it supports."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit


def encode_command(*args: str | bytes | int) -> bytes:
    """A whole command as a RESP array of bulk strings (for cold commands and the handshake)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(b), b))
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class RespAddress:
    """Where and how to connect (what a redis:// or unix:// URL says that this client supports)."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None  # unix socket
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_url(cls, url: str) -> RespAddress | None:
        """Parse a redis:// or unix:// URL; None for what this client does not speak (TLS, options)."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "unix"):
            return None
        query = dict(q.split("=", 1) for q in parts.query.split("&") if "=" in q)
        if set(query) - {"db"}:
            return None
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        if parts.scheme == "unix":
            return cls(path=parts.path, db=int(query.get("db", 0)), username=user, password=password)
        db_path = parts.path.lstrip("/")
        db = int(query.get("db", db_path or 0))
        return cls(parts.hostname or "127.0.0.1", parts.port or 6379, None, db, user, password)

    def handshake(self) -> list[bytes]:
        """Commands a fresh connection sends before any other (AUTH, SELECT)."""
        out = []
        if self.password is not None:
            auth = ("AUTH", self.username, self.password) if self.username else ("AUTH", self.password)
            out.append(encode_command(*auth))
        if self.db:
            out.append(encode_command("SELECT", self.db))
        return out
