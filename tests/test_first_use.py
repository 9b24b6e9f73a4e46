"""A newcomer's first hour (issue 11): the README's commands and what they print."""
import re
import subprocess
import sys

from conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def readme_test_command() -> str:
    """The fenced line after ``<!-- test-command -->`` (what ``.ci/run`` executes)."""
    m = re.search(r"<!-- test-command -->\s*```bash\n(.+?)\n```", README)
    assert m, "README.md lost its test command"
    return m.group(1).strip()


def test_pytest_prints_a_totals_line():
    """``pytest -q`` plus ``addopts = "-q"`` was ``-qq``: no "N passed" line for a user or CI to read."""
    cmd = readme_test_command()
    pytest_part = cmd.split("&&")[-1].split()
    assert pytest_part[:3] == ["python", "-m", "pytest"] and pytest_part[-1] == "tests", cmd
    one = "tests/test_docs.py::test_every_page_exists_and_keeps_its_examples"
    p = subprocess.run([sys.executable, *pytest_part[1:-1], "-p", "no:cacheprovider", one], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^1 passed\b", p.stdout, re.M), p.stdout


def test_ci_runs_the_readme_command_in_a_clone_with_nothing_beside_it():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "<!-- test-command -->" in ci and "git clone" in ci and "mktemp -d" in ci
    assert "passed" in ci  # and insists on the totals line
