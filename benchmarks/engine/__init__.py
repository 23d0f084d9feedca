"""Engine-level benchmark: the services called in-process, no HTTP, on a real redis-server.

One module per scenario (flash_grab, lock_storm, join_flash, evalsha, scaling, half_rate,
versus, background),
what they share in `common`, the order they run in `runner`; the measuring code is
benchmarks/harness.py, which every level uses. benchmarks/run.py calls `run_engine(bench)`;
`python -m benchmarks.engine [--quick]` runs it alone on a private redis-server.
"""

from benchmarks.engine.runner import run_engine

__all__ = ["run_engine"]
