"""Engine-level benchmark: the services called in-process, no HTTP, on a real redis-server.

The storms (storms), the interleaved comparisons (versus),
scaling and the open loop (scaling), the background jobs (background); what they share
in `common`, the order they run in `runner`. `python -m benchmarks.engine [--quick]` runs
it alone on a private redis-server.
"""

from benchmarks.engine.runner import run_engine

__all__ = ["run_engine"]
