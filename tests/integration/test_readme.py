"""The README's quick-start snippet runs as written."""

import pathlib
import re

import pytest

pytestmark = pytest.mark.integration  # a subprocess, a build or a run of the docs' code

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_quick_start_runs():
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python block"
    namespace: dict = {}
    exec(compile(blocks[0], "README quick start", "exec"), namespace)
    post = namespace["post"]
    best = namespace["best"]
    assert post.position.shape == (2, 1000, 4) and post.boundary.shape == (2, 1000)
    assert best.segments[1][-1].end == 640
    assert namespace["transition"].grad is not None


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    bash = re.findall(r"```bash\n(.*?)```", text, flags=re.S)[0]
    commands = [line for line in bash.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert "python -m torch_semimarkov demo" in commands[0]
    assert "pytest" in commands[1]
