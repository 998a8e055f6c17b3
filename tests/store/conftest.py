"""Real-Redis fixtures for the store tests (defined in tests/store/redis_fixtures.py)."""

from tests.store.redis_fixtures import any_store, key_prefix, own_redis, redis_url

__all__ = ["any_store", "key_prefix", "own_redis", "redis_url"]
