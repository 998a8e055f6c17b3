"""The normalize stage: prefix-stable prompts (volatile lines moved to the tail, canonical tools, pinned date).

`normalize` is pure apart from the `VolatilityMemory` it is given, which it updates in place.
"""

from app.normalize.memory import VolatilityMemory
from app.normalize.rules import RULES
from app.normalize.salt import cache_salt_for, salt_for_tenant
from app.normalize.stage import normalize
from app.normalize.tools import canonicalize_tools
from app.surfaces.placement import BLOCK_CLOSE, BLOCK_OPEN

__all__ = [
    "BLOCK_CLOSE",
    "BLOCK_OPEN",
    "RULES",
    "VolatilityMemory",
    "cache_salt_for",
    "canonicalize_tools",
    "normalize",
    "salt_for_tenant",
]
