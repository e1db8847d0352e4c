"""The README stays a short guide whose first two commands are the documented ones (CI runs the
second: ``.ci/run`` greps it), its example runs and prints what it says, and no relative link of
the README or of ``docs/`` points at a missing file or heading, nor does a file path they name."""

import contextlib
import io
import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DEMO_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[local]' && .venv/bin/processor demo"
# the pytest arguments after this prefix may change; .ci/run finds the line by this pattern
TEST_COMMAND_PREFIX = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest"
CI_PATTERN = re.compile(r"^python3 -m venv .venv && .* -m pytest")

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)


def _fenced_blocks(text: str) -> list[str]:
    return [m.group(1) for m in FENCE.finditer(text)]


def _prose(text: str) -> str:
    """``text`` without fenced blocks and inline code: what remains can hold links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (mkdocs) gives a heading."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def _pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_readme_begins_with_the_demo_and_the_test_command():
    blocks = _fenced_blocks(README.read_text())
    assert blocks[0] == DEMO_COMMAND + "\n"
    test_command = blocks[1].rstrip("\n")
    assert "\n" not in test_command
    assert test_command.startswith(TEST_COMMAND_PREFIX), test_command
    assert CI_PATTERN.match(test_command)


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 200


def test_every_relative_link_points_at_an_existing_file_and_heading():
    assert (ROOT / "docs").is_dir()
    broken = []
    for page in _pages():
        for target in LINK.findall(_prose(page.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):     # http:, https:, mailto:...
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_example_prints_what_it_says():
    """The README's Python example runs as it is, and its last print gives the output its
    closing comment shows."""
    block = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)[0]
    comment = [line.strip()[1:].strip() for line in block.splitlines()[-2:]]
    assert all(line.startswith(("[", "OutputRecord")) for line in comment), comment
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, str(README), "exec"), {})
    assert out.getvalue().splitlines()[-1] == " ".join(comment)


def test_every_repository_file_the_docs_name_exists():
    """A module or test renamed or split must take its mentions in the README and docs/ along."""
    named = re.compile(r"`((?:processor|backfill|benchmarks|tests|schemas)/[\w/.-]*\.(?:py|md|avsc))`")
    missing = [f"{page.relative_to(ROOT)}: {path}"
               for page in _pages() for path in named.findall(page.read_text()) if not (ROOT / path).exists()]
    assert not missing, "\n".join(missing)
