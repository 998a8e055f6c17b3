"""Mid-stream migration: a stream whose replica dies continues on another, spliced into the client's stream.

One module per surface (chat, Responses, Messages); this table says which surfaces migrate.
"""

from __future__ import annotations

from app.migration.base import Delivered, Migration, Resend, Splicer
from app.migration.chat import CHAT_MIGRATION
from app.migration.messages import MESSAGES_MIGRATION
from app.migration.responses import RESPONSES_MIGRATION

# Keyed by Surface.name; the migrations hold no state, one instance serves every request.
MIGRATIONS: dict[str, Migration] = {
    "chat_completions": CHAT_MIGRATION,
    "responses": RESPONSES_MIGRATION,
    "messages": MESSAGES_MIGRATION,
}

__all__ = ["MIGRATIONS", "Delivered", "Migration", "Resend", "Splicer"]
