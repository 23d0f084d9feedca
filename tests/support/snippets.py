"""The docs' runnable blocks: a fenced ```sh block right after the line
`<!-- snippet: <group> -->` runs against a live service, with the other blocks of its group
(the same file, in file order) in one `bash -euo pipefail`. A ```json block right after a
snippet shows what it answers, and is checked against what it answered."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
MARKER = re.compile(r"^<!-- snippet: ([A-Za-z0-9_-]+) -->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
# Where a shown answer and a real one must agree: the rest (times, ids, amounts) varies.
STABLE_FIELDS = ("status", "code", "reason")
# Variables the docs tell the reader to export, which the tests point at their own service.
EXPORTED = ("URL", "GROUPBUY_KEY")
END = "<<<snippet end>>>"
Completed = subprocess.CompletedProcess[str]


@dataclass(frozen=True)
class Block:
    """One fenced block of a Markdown file."""

    path: Path
    line: int  # the opening fence's line, from 1
    end: int  # the closing fence's line
    lang: str
    text: str
    marker: str | None  # the group named on the line before the fence, if any

    @property
    def where(self) -> str:
        """`file:line`, relative to the repository."""
        return f"{shown_path(self.path)}:{self.line}"


@dataclass(frozen=True)
class Snippet:
    """A marked ```sh block and the ```json answer shown right after it (if any)."""

    block: Block
    shown: str | None


def shown_path(path: Path) -> str:
    """`path` relative to the repository when it is in it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def doc_files() -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of `path` (fences at the start of a line), in file order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        marked = MARKER.match(lines[index - 1]) if index else None
        text = "\n".join(lines[index + 1 : end])
        found.append(
            Block(path, index + 1, end + 1, opening[1], text, marked[1] if marked else None)
        )
        index = end + 1
    return found


def misplaced_markers(path: Path) -> list[str]:
    """Each marker line not followed by a ```sh fence: a snippet that would never run."""
    lines = path.read_text(encoding="utf-8").splitlines()
    problems = []
    for number, line in enumerate(lines, start=1):
        if MARKER.match(line) and (number >= len(lines) or lines[number].rstrip() != "```sh"):
            following = lines[number] if number < len(lines) else "(end of file)"
            problems.append(f"{shown_path(path)}:{number}: marker before {following!r}")
    return problems


def snippets(path: Path) -> list[Snippet]:
    """The marked ```sh blocks of `path`, each with the ```json block right after it (only
    blank lines between) as its shown answer."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = blocks(path)
    result = []
    for number, block in enumerate(found):
        if block.marker is None or block.lang != "sh":
            continue
        shown = None
        after = found[number + 1] if number + 1 < len(found) else None
        between = lines[block.end : after.line - 1] if after is not None else []
        if after is not None and after.lang == "json" and not any(s.strip() for s in between):
            shown = after.text
        result.append(Snippet(block, shown))
    return result


def groups(paths: list[Path]) -> dict[tuple[str, str], list[Snippet]]:
    """The snippets of `paths` by (file, group), in file order."""
    grouped: dict[tuple[str, str], list[Snippet]] = {}
    for path in paths:
        for snippet in snippets(path):
            assert snippet.block.marker is not None
            key = (shown_path(path), snippet.block.marker)
            grouped.setdefault(key, []).append(snippet)
    return grouped


def section(path: Path, heading: str) -> list[Block]:
    """The fenced blocks under the `## heading` of `path`, up to the next `## ` heading."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    first = text.count("\n", 0, start) + 2
    rest = text.find("\n## ", start + 1)
    last = text.count("\n", 0, rest) + 1 if rest != -1 else text.count("\n") + 2
    return [block for block in blocks(path) if first <= block.line <= last]


def json_values(text: str) -> Iterator[object]:
    """The JSON values written one after another in `text`."""
    decoder = json.JSONDecoder()
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return
        value, position = decoder.raw_decode(text, position)
        yield value


def shows_error(shown: str) -> bool:
    """True when the shown answer is a problem (an integer `status` of 400 or more)."""
    return any(
        isinstance(value, dict) and isinstance(value.get("status"), int) and value["status"] >= 400
        for value in json_values(shown)
    )


def curl_commands(text: str) -> list[str]:
    """Each curl command of a shell block, its continued lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    return [line.strip() for line in joined.splitlines() if re.match(r"\s*curl\s", line)]


def fails_on_http_errors(command: str) -> bool:
    """True when the curl command exits non-zero on a 4xx or 5xx answer."""
    for word in command.split():
        if word in ("--fail", "--fail-with-body"):
            return True
        if re.fullmatch(r"-[A-Za-z]*f[A-Za-z]*", word):
            return True
    return False


def answer_mismatches(shown: str, answered: str) -> list[str]:
    """How the answer a snippet got differs from the one its page shows: the number of
    JSON values, each object's keys, and the fields that do not vary between runs."""
    try:
        expected, got = list(json_values(shown)), list(json_values(answered))
    except ValueError as exc:
        return [f"not JSON ({exc}): {answered!r}"]
    if len(expected) != len(got):
        return [f"{len(got)} JSON values answered, {len(expected)} shown: {answered!r}"]
    problems = []
    for want, have in zip(expected, got, strict=True):
        if not isinstance(want, dict):
            continue
        if not isinstance(have, dict) or set(want) != set(have):
            problems.append(f"shown keys {sorted(want)}, answered {have!r}")
            continue
        problems += [
            f"{field}: shown {want[field]!r}, answered {have[field]!r}"
            for field in STABLE_FIELDS
            if field in want and want[field] != have[field]
        ]
    return problems


def script(group: list[Snippet], values: dict[str, str]) -> str:
    """One bash script of the group's blocks: each block's output ends with a line of its
    own, and the variables in `values` are exported before the first block and again after
    each (a page's own `export URL=...` names the reader's service, not the test's)."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())
    parts = [exports]
    for snippet in group:
        parts.append(f"{snippet.block.text}\nprintf '\\n%s\\n' '{END}'\n{exports}")
    return "".join(parts)


def run_script(group: list[Snippet], values: dict[str, str], cwd: Path) -> Completed:
    """Run the group in one `bash -euo pipefail` in `cwd`, to its end."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script(group, values)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_group(group: list[Snippet], values: dict[str, str], cwd: Path) -> list[str]:
    """Run the group in one `bash -euo pipefail` in `cwd`; each block's output. Fails,
    showing the output, when a command fails."""
    done = run_script(group, values, cwd)
    where = group[0].block.where
    assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    outputs = done.stdout.split(f"\n{END}\n")
    assert len(outputs) == len(group) + 1 and outputs[-1] == "", done.stdout
    return outputs[:-1]


def check_group(group: list[Snippet], outputs: list[str]) -> None:
    """Every shown answer agrees with the one given; a curl that expects success fails on
    an HTTP error (or its error would pass unseen)."""
    problems = []
    for snippet, output in zip(group, outputs, strict=True):
        expects_error = snippet.shown is not None and shows_error(snippet.shown)
        problems += [
            f"{snippet.block.where}: curl without --fail-with-body (or -f): {command}"
            for command in curl_commands(snippet.block.text)
            if not expects_error and not fails_on_http_errors(command)
        ]
        if snippet.shown is not None:
            problems += [
                f"{snippet.block.where}: {problem}"
                for problem in answer_mismatches(snippet.shown, output)
            ]
    assert not problems, "\n".join(problems)


GETTING_STARTED = REPO / "docs" / "getting-started.md"
PYTHON_WALK = "Walk-through with the Python client"
VARYING = (
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"), "<time>"),
    (re.compile(r"\d+"), "<n>"),
)


def python_walk_through() -> tuple[str, str]:
    """`walk.py` as docs/getting-started.md writes it, and the output the page shows."""
    found = section(GETTING_STARTED, PYTHON_WALK)
    code = [block.text for block in found if block.lang == "python"]
    shown = [block.text for block in found if block.lang == "text"]
    assert len(code) == 1 and len(shown) == 1, [block.where for block in found]
    return code[0] + "\n", shown[0] + "\n"


def without_varying(text: str) -> list[str]:
    """The lines of `text` with times and numbers (amounts, event ids) blanked out."""
    for pattern, placeholder in VARYING:
        text = pattern.sub(placeholder, text)
    return text.splitlines()
