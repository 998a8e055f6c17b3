"""Pre-warming a replica that joins (discovered, or back after a restart): before it takes its share, replay the
stable prefixes its tenants send most, each with `max_tokens: 1`, so their first requests there hit its cache.

memory.py remembers the prefixes (per pool and tenant, bounded, in memory only); warmer.py holds a joining
replica out of rotation while it replays them, within a concurrency bound and a time budget.
"""
