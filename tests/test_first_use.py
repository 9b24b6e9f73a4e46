"""A newcomer's first hour (issue 11): the README's commands and what they print."""
import re
import subprocess
import sys

import pytest

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


def test_eta_extrapolates_from_the_first_round_not_from_start_up():
    """The first demo waited ~15 s (processes, kernels) before tree 1, then showed 'eta 138.8s' for 20 s."""
    from fedsbdt.common.cli import Progress

    times = iter([0.0, 15.0, 15.1, 15.2, 15.3, 15.4])
    p = Progress("demo", 50, clock=lambda: next(times))
    p(1, 50)
    assert p.eta(1, 50, 15.0) is None  # one point: no rate yet
    for done in (2, 3, 4, 5):
        p(done, 50)
    assert p.eta(5, 50, 15.4) == pytest.approx(0.4 / 4 * 45)  # not 15.4 / 5 * 45 = 138.6
    assert p.eta(50, 50, 99.0) == 0.0


def test_demo_counts_the_records_the_sites_train_on(tmp_path):
    """Adult: 32,561 lines, of which 2,399 hold a missing value and are dropped by the sites."""
    from fedsbdt.common.schema import Schema
    from fedsbdt.demo import Layout, _rows_text, site_ids, split_data, training_rows

    layout = Layout(tmp_path)
    assert split_data("adult", 3, layout) == 32561  # lines dealt to the sites
    rows, dropped = training_rows(layout, site_ids(3), Schema.load(ROOT / "examples/adult/schema.toml"))
    assert (rows, dropped) == (30162, 2399)
    assert _rows_text(rows, dropped) == "30162 training records (2399 rows with a missing value dropped)"
    assert _rows_text(5, 1) == "5 training records (1 row with a missing value dropped)"


def test_first_run_says_that_kernels_are_compiling(caplog):
    import logging

    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.schema import Schema
    from fedsbdt.demo import warm_up_kernels

    schema = Schema.load(ROOT / "examples/abalone/schema.toml")
    logger = logging.getLogger("fedsbdt.demo")  # a CLI test may have made "fedsbdt" stop propagating
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="fedsbdt.demo"):
            warm_up_kernels(schema, Hyperparameters(trees=5, seed=1), notice_after=0.0)
    finally:
        logger.removeHandler(caplog.handler)
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("compiling kernels (first run only") for m in msgs), msgs
    assert any(m.startswith("kernels ready in") for m in msgs), msgs


#: import name of every core dependency in pyproject.toml
IMPORT_NAMES = {"numpy": "numpy", "numba": "numba", "grpcio": "grpc", "protobuf": "google", "cryptography": "cryptography",
                "opendp": "opendp", "dp-accounting": "dp_accounting", "pandas": "pandas", "pyarrow": "pyarrow",
                "rich": "rich", "prometheus-client": "prometheus_client", "psycopg": "psycopg", "duckdb": "duckdb",
                "scikit-learn": "sklearn"}


def test_every_command_works_after_the_main_install():
    """No module behind a command imports a package outside the core dependencies (``fedsbdt report``
    needed matplotlib, which only the test extras installed)."""
    import ast
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.match(r"[A-Za-z0-9_.\-]+", d).group(0).lower() for d in deps}
    assert names == set(IMPORT_NAMES), "a core dependency changed: update IMPORT_NAMES"
    allowed = set(sys.stdlib_module_names) | set(IMPORT_NAMES.values()) | {"common", "server", "client", "fedsbdt"}
    outside = []
    for package in ("common", "server", "client"):
        for f in sorted((ROOT / package).rglob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    mods = [node.module]
                else:
                    continue
                for m in mods:
                    top = m.split(".")[0]
                    if top not in allowed:
                        outside.append(f"{rel}:{node.lineno}: {m}")
    assert not outside, outside


def test_split_defaults_are_what_the_benchmark_chose():
    """The CLI/estimator defaults of the two split knobs are the choice benchmarks/defaults.py makes from its
    saved results (recomputed here), and docs/choosing-epsilon.md states them."""
    import importlib.util
    import json

    from fedsbdt.common.config import Hyperparameters

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_defaults", ROOT / "benchmarks" / "defaults.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    saved = json.loads((ROOT / "benchmarks" / "results" / "defaults.json").read_text())
    choice = bench.choose(saved["results"])
    assert choice["chosen"] == saved["choice"]["chosen"]
    hp = Hyperparameters()
    assert {"cyclical": hp.cyclical, "split_candidates": hp.split_candidates} == choice["settings"]
    doc = (ROOT / "docs" / "choosing-epsilon.md").read_text()
    assert f"| `split_candidates` | {hp.split_candidates} |" in doc
    assert f"| `cyclical` | {'on' if hp.cyclical else 'off'} |" in doc
    # the reason to switch cyclical off is measured, not assumed
    xor = saved["results"]["xor"]["cli"]
    assert xor["cyclical+candidates32"]["mean"] < 0.55 < 0.75 < xor["uniform"]["mean"]


def test_every_flag_has_one_help_text_with_at_most_one_default():
    """evaluate/predict flags had no help; --hess-clip said '(default 1 …) (default: None)'."""
    import argparse

    from fedsbdt.cli import build_parser

    problems = []

    def walk(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, f"{path} {name}")
                continue
            h = a.help or ""
            if not h.strip() or h.count("(default") > 1:
                problems.append(f"{path} {'/'.join(a.option_strings) or a.dest}: {h!r}")

    walk(build_parser(), "fedsbdt")
    assert not problems, problems


def test_readme_and_quickstart_agree_with_their_commands():
    m = re.search(r"# the whole federation on loopback \((\d+) sites, (\w+), (\d+) trees\).*\n(fedsbdt demo .*)", README)
    assert m, "README lost the demo usage line"
    sites, dataset, trees, cmd = m.groups()
    assert f"--sites {sites}" in cmd and f"--dataset {dataset.lower()}" in cmd and f"--trees {trees}" in cmd
    quick = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    promised = re.search(r"\[quickstart\]\(docs/quickstart.md\) \| [^|]*? in (\w+) minutes", README).group(1)
    assert re.search(rf"\b{promised}\b minutes", quick, re.I), promised
