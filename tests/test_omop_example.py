"""examples/omop: the synthetic OMOP-like cohort is built in a real PostgreSQL, cohort.sql flattens it into one
row per person, and fedsbdt trains and evaluates on it with the example's schema (docs/data-sources.md)."""
import json
import subprocess
import sys

from fedsbdt.common.records import load
from fedsbdt.common.schema import Schema
from fedsbdt.common.sources import DataSource

from conftest import EXAMPLES

OMOP = EXAMPLES / "omop"


def test_the_omop_example_builds_flattens_and_trains(tmp_path, postgres):
    url = postgres.create_database("omop")
    p = subprocess.run([sys.executable, str(OMOP / "build_cohort.py"), "--db", url, "--persons", "400"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("person: 400 rows, visit_occurrence: ")
    schema = Schema.load(OMOP / "schema.toml")
    ds = load(DataSource(url, (OMOP / "cohort.sql").read_text()), schema)
    assert ds.n == 400 and ds.ids.tolist() == list(range(1, 401))  # one row per person, ids = person_id
    assert 0 < ds.y.mean() < 0.5
    bmi = schema.feature_names.index("bmi")
    assert 0 < (ds.X[:, bmi] != ds.X[:, bmi]).sum() < 200  # never measured: NULL, kept as missing
    model = tmp_path / "m.json"
    flags = ["--data", url, "--query-file", str(OMOP / "cohort.sql")]
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "train", *flags, "--schema",
                        str(OMOP / "schema.toml"), "--out", str(model), "--trees", "5", "--json", "--quiet"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "evaluate", "--model", str(model), *flags,
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["n"] == 400
