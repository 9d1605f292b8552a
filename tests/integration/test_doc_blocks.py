"""Every python code block of README.md and docs/*.md runs.

The blocks of one file run in order in one namespace, like one Python session: a block may use the
names that an earlier block of the same file defined (docs/guide.md tells its readers so). Each
block is compiled with its markdown file's line numbers, so a traceback points into the file.

A block that cannot run on every machine is marked on the line right before its fence::

    <!-- skip: needs CUDA -->

It runs where its need is met and is skipped elsewhere; the skipped blocks are reported (a warning
per file) and counted, and ``MAX_SKIP_MARKERS`` keeps them rare. Bash blocks are not run here
(``tests/integration/test_readme.py`` checks the README's two commands).
"""

import pathlib
import re
import warnings

import pytest
import torch

pytestmark = pytest.mark.integration  # a subprocess, a build or a run of the docs' code

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))

#: What a skip marker may say, and whether that need is met on this machine.
NEEDS = {"needs CUDA": torch.cuda.is_available}
#: Most skip markers allowed over all files: a block that cannot run on a CPU is the exception.
MAX_SKIP_MARKERS = 2

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.M | re.S)
SKIP = re.compile(r"<!--\s*skip:\s*(?P<reason>.*?)\s*-->")


def python_blocks(text: str):
    """``(line, code, skip_reason)`` for each python block of a markdown text, in order; ``line``
    is the 1-based line of the block's first code line, ``skip_reason`` None when unmarked."""
    blocks = []
    for m in FENCE.finditer(text):
        if m.group("lang") not in ("python", "py"):
            continue
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP.fullmatch(before.strip())
        indent = len(m.group("indent"))
        code = "\n".join(line[indent:] for line in m.group("body").split("\n"))
        line = text.count("\n", 0, m.start("body")) + 1
        blocks.append((line, code, marker.group("reason") if marker else None))
    return blocks


def _blocks_of(name):
    return python_blocks((ROOT / name).read_text())


def test_the_parser_finds_blocks_and_skip_markers():
    text = "x\n```python\na = 1\n```\n\n<!-- skip: needs CUDA -->\n```python\nb = 2\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n", None), (8, "b = 2\n", "needs CUDA")]


def test_skip_markers_are_known_and_rare():
    markers = [(name, line, reason) for name in FILES for line, _, reason in _blocks_of(name) if reason]
    for name, line, reason in markers:
        assert reason in NEEDS, f"{name}:{line}: unknown skip reason {reason!r} (known: {sorted(NEEDS)})"
    assert len(markers) <= MAX_SKIP_MARKERS, f"too many blocks marked to skip: {markers}"


@pytest.mark.parametrize("name", [name for name in FILES if _blocks_of(name)])
def test_python_blocks_run_in_order(name, capsys):
    namespace = {"__name__": f"doc_block_{pathlib.Path(name).stem}"}
    skipped = []
    for line, code, reason in _blocks_of(name):
        if reason is not None and not NEEDS[reason]():
            skipped.append(f"line {line} ({reason})")
            continue
        # pad with newlines so that a traceback gives the line in the markdown file
        exec(compile("\n" * (line - 1) + code, str(ROOT / name), "exec"), namespace)
    if skipped:
        warnings.warn(f"{name}: {len(skipped)} python block(s) skipped here: {', '.join(skipped)}", stacklevel=1)


def test_readme_and_guide_have_python_blocks():
    # a renamed fence language or a broken fence would silently leave the examples untested
    assert _blocks_of("README.md") and _blocks_of("docs/guide.md")
