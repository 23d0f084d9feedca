"""Reconciliation (对账): compare Redis, the grab rows and the ledger; report, never fix.

`reconciler` runs a pass and stores its report (`table`), `checks` reads each packet and
team from Redis and SQL, `rules` compares what was read.
"""

from groupbuy.ops.reconcile.reconciler import Reconciler

__all__ = ["Reconciler"]
