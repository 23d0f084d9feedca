"""`python -m benchmarks.engine [--full]`: the engine level alone, on a private redis-server."""

from benchmarks.engine.runner import main

main()
