"""Names the normalize config refers to, kept with the schema so the loader can check them without importing the
normalize package (which reads the config)."""

from __future__ import annotations

# Stable public rule names: tenants allow a subset of these in `normalize_rules`.
RULES: tuple[str, ...] = (
    "iso_datetime",
    "rfc2822_datetime",
    "date",
    "labelled_datetime",
    "uuid",
    "hex_id",
    "prefixed_id",
    "epoch",
    "learned",
    "section",
    "reminder",
)
