"""The documentation site's own checks: README.md's links (checked by the mkdocs hook, since
the README is not a page of the site) and the configuration that keeps the site offline."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str) -> ModuleType:
    """scripts/<name>.py as a module (scripts/ is no package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _hooks() -> ModuleType:
    return _script("mkdocs_hooks")


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


def _prose_stats() -> ModuleType:
    return _script("prose_stats")


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md"])
def test_the_front_door_and_the_architecture_keep_short_sentences(page: str) -> None:
    stats = _prose_stats().measure(ROOT / page)
    average = sum(stats.sentences) / len(stats.sentences)
    long = [words for words in stats.sentences if words > 40]
    assert average < 25, f"{page}: {average:.1f} words per sentence"
    assert not long, f"{page}: sentences of {long} words (scripts/prose_stats.py lists them)"


def test_the_readme_stays_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 160


def test_prose_stats_counts_sentences_outside_code_and_tables(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A heading is not counted\n\nOne two three. Four five, e.g. six.\n\n"
        "- a list item ends a sentence\n\n```sh\nnot. counted. at. all.\n```\n\n"
        "| cell | a longer cell |\n| --- | --- |\n"
    )
    stats = _prose_stats().measure(page)
    assert stats.sentences == [3, 4, 6]
    assert stats.longest_cell == len("a longer cell")
    assert stats.lines == 12


# The product's specification is beside the repository, not in it: a reader of the docs
# cannot follow "SPEC §3". CHANGELOG.md (docs/changelog.md includes it) keeps its history.
_SPEC_CITATION = re.compile(r"\bSPEC\b")


def _pages() -> list[Path]:
    """README.md and every page of the site but the changelog's."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    return [ROOT / "README.md", *(page for page in pages if page.name != "changelog.md")]


def test_no_page_cites_the_specification() -> None:
    """Each page cites the project's own pages, never SPEC (SPEC.md is not in the repo)."""
    citing = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in _pages()
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if _SPEC_CITATION.search(line)
    ]
    assert not citing, "\n".join(citing)


def test_the_specification_check_finds_a_citation() -> None:
    """The pattern finds the forms the docs used, and not a word that contains it."""
    cited = ["the contract is SPEC §3", "(SPEC: 2 s)", "SPEC's promise", "SPEC.md's table"]
    assert all(_SPEC_CITATION.search(line) for line in cited)
    assert not _SPEC_CITATION.search("INSPECT the SPECS")
