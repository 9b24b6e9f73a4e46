"""Strict schemas: an unknown key anywhere is refused (key, place, closest known key); feature groups."""
import subprocess
import sys
from pathlib import Path

import pytest

from fedsbdt.common.schema import Schema, SchemaError, expand_pattern

from conftest import EXAMPLES
from test_data import TOY

ROOT = Path(__file__).resolve().parents[1]

BASE = TOY.replace("range = [0, 120]", "range = [0, 120]\nallow_missing = true")  # age may be missing


def load_text(tmp_path, text):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return Schema.load(p)


@pytest.mark.parametrize("edit,needle", [
    # the examples: each was silently ignored (or blamed on the data) before
    (('id_column = "pid"', 'id_colum = "pid"'), "unknown key 'id_colum' at the top level; did you mean 'id_column'?"),
    (("allow_missing = true", "allow_mising = true"),
     "unknown key 'allow_mising' in features[0] ('age', numeric); did you mean 'allow_missing'?"),
    (('positive = ["yes"]', 'postive = ["yes"]'), "unknown key 'postive' at the top level; did you mean 'positive'?"),
    (("[format]", "[fromat]"), "unknown key 'fromat' at the top level; did you mean 'format'?"),
    (("header = true", "headr = true"), "unknown key 'headr' in [format]; did you mean 'header'?"),
    (('levels = ["A", "B"]', 'levels = ["A", "B"]\nrange = [0, 1]'),
     "unknown key 'range' in features[1] ('ward', categorical)"),
    (('name = "toy"', 'name = "toy"\nhospital = "x"'), "unknown key 'hospital' at the top level (known keys: name"),
    (('type = "numeric"', 'typ = "numeric"'), "unknown key 'typ' in features[0]; did you mean 'type'?"),
])
def test_unknown_keys_are_refused_with_place_and_closest_key(tmp_path, edit, needle):
    assert edit[0] in BASE
    with pytest.raises(SchemaError) as e:
        load_text(tmp_path, BASE.replace(*edit))
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_a_misspelt_key_is_an_exit_2_error_of_the_command_line(tmp_path):
    (tmp_path / "s.toml").write_text(BASE.replace('id_column = "pid"', 'id_colum = "pid"'))
    (tmp_path / "d.csv").write_text("pid,age,ward,label\n1,30,A,yes\n2,40,B,no\n")
    out = tmp_path / "m.json"
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "train", "--data", str(tmp_path / "d.csv"),
                        "--schema", str(tmp_path / "s.toml"), "--out", str(out), "--trees", "2"],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert "unknown key 'id_colum' at the top level; did you mean 'id_column'?" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not out.exists()


def test_every_bundled_schema_loads():
    found = sorted(EXAMPLES.glob("*/schema.toml"))
    assert len(found) >= 3
    for p in found:
        s = Schema.load(p)
        assert Schema.from_dict(s.to_dict()).digest() == s.digest()


GROUPS = """
name = "labs"
task = "regression"
target = "y"
label_range = [0, 1]
[[features]]
pattern = "lab_{1..3}"
type = "numeric"
range = [0, 10]
allow_missing = true
[[features]]
names = ["sex", "site"]
type = "categorical"
levels = ["a", "b"]
"""

WRITTEN_OUT = """
name = "labs"
task = "regression"
target = "y"
label_range = [0, 1]
""" + "".join(f"""
[[features]]
name = "lab_{k}"
type = "numeric"
range = [0, 10]
allow_missing = true
""" for k in (1, 2, 3)) + "".join(f"""
[[features]]
name = "{n}"
type = "categorical"
levels = ["a", "b"]
""" for n in ("sex", "site"))


def test_feature_groups_equal_the_features_written_out(tmp_path):
    g = load_text(tmp_path, GROUPS)
    assert g.feature_names == ["lab_1", "lab_2", "lab_3", "sex", "site"]
    assert all(f.allow_missing and (f.lo, f.hi) == (0, 10) for f in g.features[:3])
    assert g.features[4].levels == ("a", "b")
    assert g.digest() == load_text(tmp_path, WRITTEN_OUT).digest()


def test_patterns():
    assert expand_pattern("lab_{1..3}") == ["lab_1", "lab_2", "lab_3"]
    assert expand_pattern("x{08..10}_mg") == ["x08_mg", "x09_mg", "x10_mg"]
    for bad in ("lab_1", "lab_{3..1}", "a{1..2}b{1..2}", "lab_{x..y}"):
        with pytest.raises(ValueError, match="pattern"):
            expand_pattern(bad)


@pytest.mark.parametrize("edit,needle", [
    (('pattern = "lab_{1..3}"', 'pattern = "lab_{1..3}"\nname = "x"'), "exactly one of 'name', 'names'"),
    (('pattern = "lab_{1..3}"', 'pattern = "lab_1"'), "must look like"),
    (('names = ["sex", "site"]', 'names = []'), "non-empty list"),
    (('names = ["sex", "site"]', 'names = ["sex", "lab_2"]'), "duplicate feature names"),
    (('names = ["sex", "site"]', 'names = ["sex", 3]'), "non-empty strings"),
])
def test_bad_groups(tmp_path, edit, needle):
    assert edit[0] in GROUPS
    with pytest.raises(SchemaError, match=needle):
        load_text(tmp_path, GROUPS.replace(*edit))
