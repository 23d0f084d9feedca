"""Webhooks: the events feed pushed to the shop's endpoints, signed per Standard Webhooks,
retried on a schedule and never dropped (SPEC §3 "Webhooks (admin) — the feed, pushed").

models (SQL tables), signing (headers and signatures), secrets, addresses (which hosts a
delivery may reach), schedule (when a failed attempt is tried again), store (endpoints and
their admin operations), queue (deliveries derived from the feed, claimed in SQL), sender
(the HTTP client), deliverer (the loop that ties them together).
"""
