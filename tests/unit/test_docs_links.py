"""Every relative link in README.md, docs/*.md and benchmarks/results/README.md points at a file that exists,
and a `#fragment` into a Markdown file names one of its headings (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "results" / "README.md"]

# [text](target) and ![alt](target); the target ends at whitespace (an optional "title" follows) or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
EXTERNAL = ("http://", "https://", "mailto:")


def _fenceless_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _prose(text: str) -> str:
    """The page without code: fenced blocks and inline code spans may contain `](`."""
    return "\n".join(re.sub(r"`[^`]*`", "``", line) for line in _fenceless_lines(text))


def links(text: str) -> list[str]:
    return LINK.findall(_prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but - and _), spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    headings = [line.lstrip("#").strip() for line in _fenceless_lines(text) if re.match(r"#{1,6} ", line)]
    return {slug(h) for h in headings}


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """'target (why)' for every relative link of `page` that does not resolve (paths shown relative to `root`)."""
    bad = []
    for target in links(page.read_text(encoding="utf-8")):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            bad.append(
                f"{target} (no file {resolved.relative_to(root) if resolved.is_relative_to(root) else resolved})"
            )
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            bad.append(f"{target} (no heading #{fragment} in {resolved.relative_to(root)})")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert page.exists(), f"{page.relative_to(ROOT)} is missing"
    assert broken_links(page) == []


def test_the_readme_is_a_front_door():
    """At most 300 lines (issue 32), and its Docs list links every page in docs/."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count("\n") <= 300, f"README.md has {text.count(chr(10))} lines; move sections into docs/"
    linked = {target.partition("#")[0] for target in links(text)}
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "pages in docs/ that README.md does not link"


def test_the_checker_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    """Negative control: a missing file and a missing heading are both reported; a good link, a link inside code
    and an external link are not."""
    (tmp_path / "other.md").write_text("# Title\n\n## Any TP degree: `pad=True`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#any-tp-degree-padtrue) [gone](missing.md) [bad anchor](other.md#nowhere)\n"
        "`[in code](missing2.md)` [web](https://example.com/x)\n```\n[fenced](missing3.md)\n```\n"
    )
    bad = broken_links(page, root=tmp_path)
    assert [b.split(" ")[0] for b in bad] == ["missing.md", "other.md#nowhere"]


def test_the_readme_test_command_is_the_one_ci_runs():
    """The README promises one test command; .ci/run must run exactly it (the lead keeps both working)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^python -m pytest[^\n]*$", readme, flags=re.M)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert len(commands) == 1 and commands[0] in ci, (commands, "not a line of .ci/run")
