"""`python -m benchmarks.engine [--quick]`: the engine level alone, on a private redis-server."""

from benchmarks.engine.runner import main

main()
