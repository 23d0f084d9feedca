"""The documentation site's own checks: README.md's links (checked by the mkdocs hook, since
the README is not a page of the site) and the configuration that keeps the site offline."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_broken_links_names_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ops.md").write_text("# Ops\n\n## The fault matrix (`tests/faults/`)\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/ops.md) [ok](docs/ops.md#the-fault-matrix-testsfaults) [web](https://x.org/a)\n"
        "[gone](docs/gone.md) [no heading](docs/ops.md#nothing) [self](#top)\n"
        "```sh\n[in code](docs/also-gone.md)\n```\n"
    )
    assert _hooks().broken_links(readme) == [
        "docs/gone.md: no such file",
        "docs/ops.md#nothing: no such heading",
    ]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Failover in a Redis Cluster", "failover-in-a-redis-cluster"),
        ("4. Redis Cluster + PostgreSQL + N replicas", "4-redis-cluster--postgresql--n-replicas"),
        ("Settings (`[webhooks]`)", "settings-webhooks"),
    ],
)
def test_slugs_are_the_sites_anchors(heading: str, anchor: str) -> None:
    assert _hooks().slug(heading) == anchor


def test_the_site_loads_nothing_from_other_hosts() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "font: false" in config  # else the theme links Google Fonts
    assert "- offline" not in config  # the offline plugin loads a shim from a CDN
    assert "hooks:\n  - scripts/mkdocs_hooks.py" in config
