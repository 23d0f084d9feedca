"""Storage: the Redis client, scripts registry, keys and clock, SQL, events and the outbox.

Nothing in here knows group buys or red packets; the engines build on it.
"""
