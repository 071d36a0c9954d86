"""The user guides' code runs as shown.

Each guide is a level-2 section of README.md (``GUIDES``: its heading). A guide's fenced blocks are taken
in order, in a fresh directory that looks like a checkout's root (``confs/`` is there, as when a user runs the
commands from the repository): a block whose first line is ``# file: NAME`` (python or gin) is written to NAME, as the
guide tells the reader to save it; every other ``python`` block is run with ``python`` there, one process each, and
must exit 0 within ``BLOCK_TIMEOUT_S``. Blocks of other languages (shell commands, gin excerpts) are not run.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDES = (
    "## From Python",
    "## Guide: writing an algorithm",
    "## Guide: your own environment",
    "## Guide: your own network",
    "## Guide: your own dataset",
    "## Guide: seeds and reproducibility",
)
BLOCK_TIMEOUT_S = 120
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_FILE = re.compile(r"#\s*file:\s*([\w.-]+)\s*$")

pytestmark = [pytest.mark.timeout(300)]


def section(text: str, heading: str) -> str | None:
    """The text under ``heading`` (a line of its own) up to the next level-1 or level-2 heading outside a fenced block
    (a block's ``# comment`` lines are not headings); None if absent."""
    fences = [m.span() for m in _FENCE.finditer(text)]
    headings = [m for m in re.finditer(r"^#{1,2} [^\n]*$", text, re.MULTILINE)
                if not any(a <= m.start() < b for a, b in fences)]
    for i, match in enumerate(headings):
        if match.group(0).rstrip() == heading:
            end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
            return text[match.end() + 1:end]
    return None


def guide_text(heading: str) -> str:
    """The guide under ``heading`` in README.md."""
    found = section(README.read_text(encoding="utf-8"), heading)
    assert found is not None, f"README.md has no section {heading!r}"
    return found


def blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of each fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(text)]


def test_section_stops_at_the_next_heading_outside_code_blocks():
    text = "## A\nintro\n```python\n# a comment, not a heading\nx = 1\n```\nmore\n## B\nb\n"
    assert section(text, "## A") == "intro\n```python\n# a comment, not a heading\nx = 1\n```\nmore\n"
    assert section(text, "## B") == "b\n" and section(text, "## C") is None
    assert blocks(section(text, "## A")) == [("python", "# a comment, not a heading\nx = 1\n")]


@pytest.mark.parametrize("heading", GUIDES, ids=[h.split(": ")[-1].removeprefix("## ") for h in GUIDES])
def test_guide_code_runs(heading, tmp_path):
    code = blocks(guide_text(heading))
    runnable = [source for language, source in code if language == "python" and not _FILE.match(source.split("\n")[0])]
    assert runnable, f"{heading!r} has no python block to run"
    (tmp_path / "confs").symlink_to(REPO / "confs", target_is_directory=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.pop("DISPLAY", None)
    for index, (language, source) in enumerate(code):
        named = _FILE.match(source.split("\n")[0])
        if named:
            (tmp_path / named.group(1)).write_text(source, encoding="utf-8")
            continue
        if language != "python":
            continue
        script = tmp_path / f"guide_block_{index}.py"
        script.write_text(source, encoding="utf-8")
        proc = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S)
        assert proc.returncode == 0, (f"{heading}, block {index + 1} exited {proc.returncode}:\n{source}\n"
                                      f"--- stdout:\n{proc.stdout[-2000:]}\n--- stderr:\n{proc.stderr[-4000:]}")
