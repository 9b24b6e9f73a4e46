"""The documentation's examples run, its error messages are real, its links resolve.

In ``docs/*.md`` a fenced block right after ``<!-- doctest -->`` is executed:
``bash`` blocks in a shell (``fedsbdt`` is this checkout's CLI), ``python``
blocks in-process; each must succeed.  A ``bash`` block after
``<!-- doctest: error -->`` must exit with status 2, and its last stderr line
must equal the ``text`` block that follows it.  All blocks of one page run in
order in one scratch directory that links ``examples/`` (so pages read like a
session in the repository root).

A ``bash`` block after ``<!-- doctest: podman -->`` builds or runs containers:
such blocks run in order in a copy of the repository, with pip pointed at the
wheelhouse only (``PIP_NO_INDEX``: what a connected machine's index serves) and
``BASE_IMAGE`` naming a local base image — where podman, the base image and the
wheelhouse exist (tests/container_engine.py), and are skipped with the reason
elsewhere.
"""
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT
from container_engine import BASE_IMAGE, copy_repository, offline_pip_env, unavailable

DOCS = ROOT / "docs"
OWN = ["quickstart.md", "threat-model.md", "choosing-epsilon.md", "deployment.md", "troubleshooting.md", "greedy.md",
       "sklearn.md", "xgboost-export.md", "missing-values.md", "multiclass.md", "dpboost.md", "sarus.md",
       "federated-evaluation.md", "modes.md", "auto.md", "plugins.md", "explain.md", "audit.md"]
MIN_BLOCKS = {"quickstart.md": 4, "choosing-epsilon.md": 1, "troubleshooting.md": 4, "sklearn.md": 1,
              "xgboost-export.md": 1, "deployment.md": 10, "greedy.md": 2, "multiclass.md": 3,
              "dpboost.md": 1, "sarus.md": 2, "federated-evaluation.md": 1,
              "plugins.md": 3, "explain.md": 1}
PENDING: set[str] = set()  # repository files a page may link before they exist (none at present)
MARKER = re.compile(r"^<!-- doctest(?:: (error|podman))? -->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    error: bool = False
    expect: str = ""
    podman: bool = False


def _fence(lines: list[str], i: int, page: str) -> tuple[str, str, int]:
    """The fenced block starting at line ``i``: (language, body, index after the closing fence)."""
    m = re.match(r"^```(\w+)\s*$", lines[i]) if i < len(lines) else None
    if not m:
        raise AssertionError(f"{page}:{i + 1}: a doctest marker must be followed by a fenced block")
    j = i + 1
    while j < len(lines) and lines[j].strip() != "```":
        j += 1
    if j == len(lines):
        raise AssertionError(f"{page}:{i + 1}: unclosed fence")
    return m.group(1), "\n".join(lines[i + 1:j]) + "\n", j + 1


def blocks(page: str) -> list[Block]:
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if not m:
            i += 1
            continue
        lang, code, i = _fence(lines, i + 1, page)
        if m.group(1) == "error":
            assert lang == "bash", f"{page}: error blocks are bash"
            tlang, expect, i = _fence(lines, i, page)
            assert tlang == "text", f"{page}: an error block is followed by a text block with the message"
            out.append(Block(page, i, lang, code, True, expect.strip()))
        elif m.group(1) == "podman":
            assert lang == "bash", f"{page}: podman blocks are bash"
            out.append(Block(page, i, lang, code, podman=True))
        else:
            assert lang in ("bash", "python"), f"{page}: doctest blocks are bash or python, not {lang}"
            out.append(Block(page, i, lang, code))
    return out


def pages_with_blocks(podman: bool = False) -> list[str]:
    return sorted(p.name for p in DOCS.glob("*.md") if any(b.podman == podman for b in blocks(p.name)))


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A directory that looks like the repository root for the snippets, and a ``fedsbdt`` on PATH."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "fedsbdt"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fedsbdt.cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.chdir(tmp_path)
    return tmp_path, env


def run_block(b: Block, cwd: Path, env: dict) -> None:
    where = f"{b.page} (block ending at line {b.line})"
    if b.lang == "python":
        exec(compile(b.code, where, "exec"), {"__name__": "__doctest__"})  # noqa: S102 — our own docs
        return
    p = subprocess.run(["bash", "-c", ("set -eo pipefail\n" if not b.error else "") + b.code], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=1800 if b.podman else 300)
    assert "Traceback" not in p.stderr, f"{where}:\n{p.stderr}"
    if b.error:
        assert p.returncode == 2, f"{where}: expected exit status 2, got {p.returncode}\n{p.stderr}"
        last = p.stderr.strip().splitlines()[-1]
        assert last == b.expect, f"{where}: the documented message is\n  {b.expect}\nbut the command says\n  {last}"
    else:
        assert p.returncode == 0, f"{where}: exit status {p.returncode}\n{p.stdout}\n{p.stderr}"


@pytest.mark.parametrize("page", pages_with_blocks())
def test_examples_run(page, scratch):
    cwd, env = scratch
    for b in blocks(page):
        if not b.podman:
            run_block(b, cwd, env)


@pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
@pytest.mark.xdist_group("containers")  # builds and runs fedsbdt:latest, as test_compose_podman.py does
@pytest.mark.parametrize("page", pages_with_blocks(podman=True))
def test_container_examples_run(page, tmp_path):
    """The podman blocks (the offline image build) in a copy of the repository, with no package index."""
    repo = copy_repository(tmp_path / "fedsbdt")
    env = offline_pip_env(dict(os.environ, BASE_IMAGE=BASE_IMAGE))
    for b in blocks(page):
        if b.podman:
            run_block(b, repo, env)


def test_every_page_exists_and_keeps_its_examples():
    for page in OWN:
        assert (DOCS / page).is_file(), page
    for page, n in MIN_BLOCKS.items():
        assert len(blocks(page)) >= n, f"{page} lost doctest blocks"
    assert "deployment.md" in pages_with_blocks(podman=True), "deployment.md lost its offline image build"


def _slug(heading: str) -> str:
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def test_links_resolve():
    problems = []
    for page in OWN:
        text = (DOCS / page).read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (DOCS / path).resolve() if path else DOCS / page
            rel = os.path.relpath(file, ROOT)
            if rel in PENDING:
                continue
            if not file.exists():
                problems.append(f"{page}: {target} does not exist")
            elif anchor:
                heads = {_slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)}
                if anchor not in heads:
                    problems.append(f"{page}: no heading #{anchor} in {path or page}")
    assert not problems, problems
