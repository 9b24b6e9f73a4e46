"""Federated = central with ``auto`` settings (docs/auto.md): the rule applied to the same public inputs (schema,
ε, the declared row count) gives the plan the same hyperparameters as ``fedsbdt train --rows N``, and three site
processes then release the centralised engine's model."""
from __future__ import annotations

import json

from .conftest import SITES, abalone_with_ids, assert_same_trees, central_training, models_identical, \
    tls_session_files


def test_three_site_processes_with_auto_settings_train_the_central_model(tmp_path, ca_dir, cluster_factory):
    from fedsbdt.common.auto import resolve
    from fedsbdt.common.config import Hyperparameters

    schema, raw = abalone_with_ids(300)
    # what `fedsbdt auto --rows 300` gives a plan and `fedsbdt train --rows 300` uses (5 trees keep it short)
    keys, choice = resolve({"epsilon": 1.0, "trees": 5, "seed": 13}, schema, len(raw))
    hp = Hyperparameters.from_dict(keys)
    assert choice is not None and hp.l2 > 1.0 and hp.l2 == choice.settings["l2"]  # auto chose beyond the flags
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, randomness="insecure-test", test_seed=3,
                              test_noise=False)
    cluster_factory(tmp_path / "plan.toml").run(files.data, "--allow-insecure-test-randomness")
    model = json.loads(models_identical(tmp_path, SITES))
    assert model["hyperparameters"] == hp.to_dict()
    _, res = central_training(tmp_path, schema, raw, hp, seed=3)
    assert model["init_score"] == res.model.init_score
    assert_same_trees(model, res.model)


def _keys(n: int = 3):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return {s: Ed25519PrivateKey.generate() for s in SITES[:n]}


def _roster(keys) -> list[str]:
    return [f"--site={s}={k.public_key().public_bytes_raw().hex()}" for s, k in keys.items()]


def _run_in_process(tmp_path, plan, keys, paths):
    """The plan's session and one SiteMachine per site, over the in-process transport (inproc.py)."""
    from fedsbdt.client.site import SiteMachine, SiteOptions
    from fedsbdt.server.session import Session

    from .inproc import Clock, InProcess

    clock = Clock()
    session = Session(plan, plan.make_randomness(True), clock.now)
    machines = {}
    for s in keys:
        m = SiteMachine(s, keys[s], paths[s], tmp_path / f"state-{s}",
                        SiteOptions(expected_plan_sha256=plan.sha256, allow_insecure_test_randomness=True))
        m.accept_plan(plan.canonical_json, plan.sha256)
        machines[s] = m
    fed = InProcess(session, machines, clock)
    for s in keys:
        fed.join(s)
    fed.run()
    assert session.exit_code == 0 and not fed.rejected and not fed.refusals, session.stage
    return session


def test_fedsbdt_plan_pins_the_auto_settings_of_train_and_the_federation_trains_the_central_model(tmp_path, capsys):
    """`fedsbdt plan --rows N` (auto, the default) pins exactly the hyperparameters `fedsbdt train --rows N` uses
    for the same public inputs, λ included; an in-process federation on that plan file releases the centralised
    engine's model bit for bit (seeded, noise off)."""
    from fedsbdt.cli import main
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.federation.plan import Plan

    from .conftest import write_splits

    schema, raw = abalone_with_ids(240)
    schema_file = tmp_path / "schema.toml"
    from fedsbdt.common.federation.toml_writer import dumps

    schema_file.write_text(dumps(schema.to_dict()))
    keys = _keys()
    paths = write_splits(raw, list(keys), tmp_path / "data")
    public = ["--epsilon", "4", "--rows", str(len(raw)), "--trees", "5", "--seed", "13"]
    assert main(["plan", "--schema", str(schema_file), *_roster(keys), *public, "--insecure-test-randomness", "3",
                 "--no-test-noise", "--max-records", "10000", "--out", str(tmp_path / "plan.toml"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    plan = Plan.load(tmp_path / "plan.toml")
    hp = plan.hyperparameters
    assert printed["settings"] == "auto" and printed["hyperparameters"] == hp.to_dict()
    # auto chose beyond the flags: the rule's depth, γ and cyclical for these public inputs (at ε·n = 960 a
    # regression schema with a categorical feature gets the paper's depth 3, γ 0.1, cyclical, docs/auto.md), λ > 1
    from fedsbdt.common.auto import AutoInputs, auto_settings

    rule = auto_settings(AutoInputs.for_schema(schema, 4.0, hp.delta, len(raw))).settings
    assert (hp.depth, hp.subsample, hp.cyclical) == (rule["depth"], rule["subsample"], rule["cyclical"])
    assert hp.l2 > 1.0
    assert printed["auto"]["settings"]["l2"] == hp.l2 and "trees" not in printed["auto"]["settings"]  # given
    # central `fedsbdt train` with the same public inputs uses the same hyperparameters
    union = tmp_path / "union.csv"
    raw.to_csv(union, index=False)
    assert main(["train", "--data", str(union), "--schema", str(schema_file), *public, "--out",
                 str(tmp_path / "central.json"), "--json", "--quiet"]) == 0
    capsys.readouterr()
    central = json.loads((tmp_path / "central.json").read_text())
    assert central["hyperparameters"] == hp.to_dict()
    # the federation on that plan file releases the engine's model
    session = _run_in_process(tmp_path, plan, keys, paths)
    model = json.loads(session.model_json)
    _, res = central_training(tmp_path, schema, raw, hp, seed=3)
    assert model["hyperparameters"] == hp.to_dict() and model["init_score"] == res.model.init_score
    assert_same_trees(model, res.model)


def test_plan_without_a_row_count_is_one_line_and_explicit_flags_keep_the_papers_settings(tmp_path, capsys):
    from fedsbdt.cli import main
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.federation.plan import Plan

    from .conftest import EXAMPLES

    base = ["plan", "--schema", str(EXAMPLES / "abalone" / "schema.toml"), *_roster(_keys()), "--seed", "5"]
    assert main([*base, "--out", str(tmp_path / "a.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rows N" in err and "--settings paper" in err
    assert not (tmp_path / "a.toml").exists()
    assert main([*base, "--rows", "0", "--out", str(tmp_path / "a.toml")]) == 2
    assert "--rows 0" in capsys.readouterr().err
    # the paper's settings: with --settings paper, or with every key the rule sets given explicitly
    assert main([*base, "--settings", "paper", "--out", str(tmp_path / "p.toml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"] == "paper"
    assert Plan.load(tmp_path / "p.toml").hyperparameters == Hyperparameters(seed=5)
    paper = Hyperparameters(seed=5)
    explicit = ["--trees", "100", "--depth", "3", "--subsample", "0.1", "--learning-rate", "0.1", "--cyclical",
                "--split-candidates", "32", "--init-share", "0.1", "--grad-clip", "0.5", "--l2", "1"]
    assert main([*base, "--rows", "3342", *explicit, "--out", str(tmp_path / "e.toml")]) == 0
    assert Plan.load(tmp_path / "e.toml").hyperparameters == paper
    capsys.readouterr()


def test_fedsbdt_auto_prints_every_setting_a_plan_needs_and_they_are_the_plans(tmp_path, capsys):
    from fedsbdt.cli import main
    from fedsbdt.common.federation.plan import Plan

    from .conftest import EXAMPLES

    schema = str(EXAMPLES / "adult" / "schema.toml")
    assert main(["auto", "--schema", schema, "--epsilon", "1", "--rows", "30162", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["settings"]["l2"] > 1  # λ matched to the noise, as train and plan use it
    # a plan built from the printed flags equals the plan auto makes, which equals train's settings
    flags = got["plan_flags"].split()
    base = ["plan", "--schema", schema, *_roster(_keys()), "--seed", "9", "--epsilon", "1"]
    assert main([*base, "--settings", "paper", *flags, "--out", str(tmp_path / "f.toml")]) == 0
    assert main([*base, "--rows", "30162", "--out", str(tmp_path / "a.toml")]) == 0
    capsys.readouterr()
    a, f = Plan.load(tmp_path / "a.toml"), Plan.load(tmp_path / "f.toml")
    assert a.hyperparameters == f.hyperparameters and a.hyperparameters.l2 == got["settings"]["l2"]


def test_the_demo_uses_the_auto_settings_for_the_records_its_sites_train_on(tmp_path, capsys):
    """`fedsbdt demo` declares the records it deals to its sites and takes `train --rows N`'s settings for them;
    `--settings paper` and explicit flags override it."""
    from fedsbdt.common.auto import resolve
    from fedsbdt.cli import main
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.federation.plan import Plan

    def prepare(name, *flags):
        assert main(["demo", "--prepare", str(tmp_path / name), "--seed", "4", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)["rows"], Plan.load(tmp_path / name / "plan" / "plan.toml")

    rows, plan = prepare("auto")
    assert rows == 3342
    keys, _ = resolve({"epsilon": 1.0, "seed": 4}, plan.schema, rows)
    assert plan.hyperparameters == Hyperparameters.from_dict(keys) and plan.hyperparameters.l2 > 1.0
    assert prepare("paper", "--settings", "paper")[1].hyperparameters == Hyperparameters(seed=4)
    given = prepare("given", "--trees", "7")[1].hyperparameters
    assert given.trees == 7 and given.depth == plan.hyperparameters.depth != 3
