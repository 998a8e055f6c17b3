"""Real-Redis fixtures come from tests/store/redis_fixtures.py, registered as a plugin in tests/conftest.py."""
