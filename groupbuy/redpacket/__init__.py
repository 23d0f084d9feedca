"""Red packets: send, grab, durable records, ledger, expiry refund."""
