"""The Redis backends a suite names when it does not run on the default two (fake, real):

pytestmark = pytest.mark.parametrize("backend", [REAL, CLUSTER])
"""

from __future__ import annotations

import pytest

FAKE = pytest.param("fake")
REAL = pytest.param("real", marks=pytest.mark.real)
# A real 3-master Redis Cluster (the session's: tests/conftest.py, cluster_url).
CLUSTER = pytest.param("cluster", marks=[pytest.mark.real, pytest.mark.cluster])
ALL = [FAKE, REAL, CLUSTER]
# What each backend is, for the figures the race tests print.
WHERE = {
    "fake": "fakeredis",
    "real": "the real redis-server",
    "cluster": "a 3-master Redis Cluster",
}
