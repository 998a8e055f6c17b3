"""The configuration's building blocks, shared by every config model: the strict base and the enumerations.

Imports nothing from app/, so every block of the schema (app/config/*.py) and the request path (app/context.py)
can use them without an import cycle.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

RouteClassName = Literal["interactive", "bulk"]
ROUTE_CLASSES: tuple[RouteClassName, ...] = get_args(RouteClassName)
NormalizeMode = Literal["off", "observe", "on"]
# What happens to a request over a limit or refused by a full admission queue: 429, or served as bulk.
OnExceed = Literal["reject", "degrade"]


class StrictModel(BaseModel):
    """The base of every config model: an unknown key is an error (a typo is never silently ignored), and a
    loaded config is immutable (every part of the gateway may hold it without copying)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
