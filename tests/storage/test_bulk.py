"""groupbuy/storage/bulk.py: driver SQL written once with `?`, run in either database."""

from __future__ import annotations

import pytest

from groupbuy.storage.bulk import in_paramstyle, placeholders


def test_placeholders_become_the_driver_s_own() -> None:
    """SQLite keeps `?`; asyncpg gets `$1`, `$2`, ... in order; another style is refused."""
    sql = f"SELECT a FROM t WHERE b = ? AND c IN ({placeholders(3)})"
    assert in_paramstyle(sql, "qmark") == sql
    assert in_paramstyle(sql, "numeric_dollar") == (
        "SELECT a FROM t WHERE b = $1 AND c IN ($2, $3, $4)"
    )
    with pytest.raises(ValueError):
        in_paramstyle(sql, "pyformat")
