"""groupbuy: group-buy seat locking and red-packet grabbing decided atomically in Redis."""

__version__ = "0.1.0"
