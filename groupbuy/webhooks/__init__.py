"""Webhooks: the events feed pushed to the shop's endpoints, signed per Standard Webhooks,
retried on a schedule and never dropped (SPEC §3 "Webhooks (admin) — the feed, pushed").

models (SQL tables), store (endpoints, their secrets and admin operations), signing
(headers and signatures), addresses (which hosts a delivery may reach), schedule (when a
failed attempt is tried again), queue (deliveries derived from the feed, claimed in SQL),
sender (the HTTP client), outcomes (what an ended attempt changes), recorder (outcomes
written in batches), history (the admin's page, replays, the backlog), deliverer (the loop
that ties them together), thread (the deliverer on a thread of its own), service (what the
API asks).
"""
