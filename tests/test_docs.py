"""The documentation stays true: the README's commands, every relative link, the generated
reference, the license. Plain file reads and one subprocess; no TVM build, no Ray."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# CI runs these exactly as the README gives them (.ci/run runs the second).
MAIN_JOB = (
    "python3.11 -m venv .venv && .venv/bin/pip install -e . && "
    ".venv/bin/tune --model resnet50 --device cpu --trials 64 -o resnet50.so"
)
# The fast tier in two processes, then the rest (Ray clusters, PostgreSQL, timings) one at a time.
TESTS = ("python3.11 -m venv .venv && .venv/bin/pip install -e '.[dev]' && "
         ".venv/bin/python -m pytest -q -m fast -n 2 && .venv/bin/python -m pytest -q -m 'not fast'")

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _markdown_files() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _relative_links(path: Path) -> list[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    out = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the same page
        out.append(target)
    return out


def test_readme_is_short_and_gives_the_two_commands():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move details into docs/"
    assert MAIN_JOB in lines, "README.md must give the main job's command exactly, on a line of its own"
    assert TESTS in lines, "README.md must give the test command exactly, on a line of its own"


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files(path: Path):
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    broken = []
    for target in _relative_links(path):
        file = target.split("#", 1)[0].split("?", 1)[0]
        if file and not (path.parent / file).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} links to missing files: {broken}"


def test_link_checker_sees_links():
    # A regex that matched nothing would pass every page above.
    assert "docs/index.md" in _relative_links(README)
    assert "LICENSE" in _relative_links(README)


def test_reference_is_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    hint = "docs/reference.md is stale: run .venv/bin/python docs/gen_reference.py\n"
    assert proc.returncode == 0, hint + proc.stdout[-4000:] + proc.stderr[-2000:]


def test_license_is_apache_2():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
