"""Shared learning: the volatility memory's learned keys kept in the Store, so a new gateway replica starts warm.

Only 64-bit template fingerprints (`scan.fingerprint`, keyed per tenant from `normalize.salt_secret`) cross
the wire: never prompt text, never values. Nothing here runs on the request path: the gateway loads the
shared sets before it serves, then a background task writes what this process learned and reads what the
others did every `normalize.shared_refresh_s`. A store that cannot be reached fails open: learning stays
local (what it was before sharing) and the pending keys are written on a later round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from app.config import GatewayConfig
from app.normalize.memory import VolatilityMemory
from app.store.base import Store, StoreUnavailable

log = logging.getLogger(__name__)


class SharedLearning:
    """Moves learned fingerprints between one process's `VolatilityMemory` and the Store's per-tenant sets."""

    def __init__(
        self, memory: VolatilityMemory, store: Store, tenant_ids: Sequence[str], refresh_s: float = 5.0
    ) -> None:
        self.memory = memory
        self.store = store
        self.tenant_ids = list(tenant_ids)
        self.refresh_s = refresh_s
        self._warned = False

    @classmethod
    def for_config(cls, cfg: GatewayConfig, memory: VolatilityMemory, store: Store) -> SharedLearning | None:
        """Sharing for the tenants that normalize (observe or on), or None when it is off or none does."""
        tenant_ids = [t.id for t in cfg.tenants if t.normalize != "off"]
        if not cfg.normalize.share_learning or not tenant_ids:
            return None
        return cls(memory, store, tenant_ids, cfg.normalize.shared_refresh_s)

    async def load(self) -> bool:
        """Read every tenant's shared set into the memory; False (and the memory unchanged) if the store is down."""
        try:
            sets = await self.store.volatile_fingerprints(self.tenant_ids)
        except StoreUnavailable as err:
            self._unavailable(err)
            return False
        for tenant_id, fingerprints in sets.items():
            self.memory.for_tenant(tenant_id).set_shared(fingerprints)
        self._warned = False
        return True

    async def flush(self) -> bool:
        """Write what this process learned since the last flush; False if the store is down (kept for later)."""
        for tenant_id in self.memory.pending_tenants():
            mem = self.memory.for_tenant(tenant_id)
            publish, forget = mem.take_pending()
            try:
                await self.store.add_volatile(tenant_id, publish, forget)
            except StoreUnavailable as err:
                mem.requeue(publish, forget)
                self._unavailable(err)
                return False
        return True

    async def run(self) -> None:
        """Every `refresh_s`: flush, then load (a key this process saw settle is forgotten before it is read)."""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                if await self.flush():
                    await self.load()
            except Exception:  # a bug here must not end sharing silently for the process's life
                log.exception("shared learning: refresh failed")

    def _unavailable(self, err: StoreUnavailable) -> None:
        # Once per outage: the background task retries every few seconds.
        if not self._warned:
            log.warning("shared learning: store unavailable (%s); learning stays local until it answers", err)
            self._warned = True
