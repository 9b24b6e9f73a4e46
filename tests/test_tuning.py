"""Private tuning (common/tuning.py): eq. T1's accounting against dp-accounting composing each record's
mechanisms, the short list (auto's setting always first), the small-budget fallback to auto, the held-out split,
and ``fedsbdt tune`` end to end (docs/auto.md)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedsbdt.common.tuning import (DEEP, MIN_BUDGET_LOG10, PROBE_SHARE, candidates, fresh_split_key, holdout_mask,
                                   plan_tuning, record_scores, search_rdp, shortlist, should_search)

CENTRE = dict(trees=300, depth=5, subsample=0.3, learning_rate=0.1, cyclical=True, split_candidates=32,
              tree_builder="random", init_share=0.1, grad_clip=1.0)


def oracle_epsilon(settings: list[dict], eps_probe: float, sigma_score: float, eps_final: float, delta: float,
                   orders: np.ndarray) -> float:
    """Independent of eq. T1's code: list the mechanisms one record takes part in — a training-part record: every
    probe's training, then the final training; a held-out record: m Gaussian score sums (sensitivity 1), then the
    final training — and compose them with dp-accounting's RDP accountant (each tree a Poisson-subsampled
    Gaussian; the initial score's two pure-DP releases by their RDP bound); the final training is the winner's,
    unknown in advance, so every candidate's is tried at each order; the worse record kind; dp-accounting's
    (ε, δ) conversion."""
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    from fedsbdt.common.accountant import init_score_rdp
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.engine import calibration_for

    def training(acc, setting, eps):
        hp = Hyperparameters.from_dict({**setting, "epsilon": eps, "delta": delta})
        cal = calibration_for(hp)
        acc.compose(SelfComposedDpEvent(PoissonSampledDpEvent(cal.gamma, GaussianDpEvent(cal.sigma / math.sqrt(2))),
                                        hp.accounted_rounds))
        return init_score_rdp(orders, cal.eps_init, cal.eps_ds)

    worst = np.zeros(len(orders))
    for final in settings:
        for kind in ("training part", "held out"):
            acc = rdp_lib.RdpAccountant(list(map(float, orders)))
            extra = np.zeros(len(orders))
            if kind == "training part":
                for s in settings:
                    extra += training(acc, s, eps_probe)
            else:
                acc.compose(SelfComposedDpEvent(GaussianDpEvent(sigma_score), len(settings)))
            extra += training(acc, final, eps_final)
            worst = np.maximum(worst, np.asarray(acc._rdp) + extra)
    return float(compute_epsilon(orders, worst, delta)[0])


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_search_total_matches_dp_accounting_composing_each_records_mechanisms(eps):
    from fedsbdt.common.tuning import orders_for

    space = shortlist(CENTRE, "binary", all_numeric=True)
    assert len(space) == 3
    plan = plan_tuning(space, eps, 5e-8)
    ref = oracle_epsilon(space, plan.epsilon_probe, plan.sigma_score, plan.epsilon_final, 5e-8,
                         orders_for(eps, 5e-8))
    assert plan.epsilon == pytest.approx(ref, rel=1e-9)
    assert plan.epsilon <= eps and plan.epsilon_probe == pytest.approx(PROBE_SHARE * eps)
    assert 0.8 * eps < plan.epsilon_final < eps  # most of ε goes to the released model
    # the plan is the largest final budget that fits: 1 % more does not
    over = oracle_epsilon(space, plan.epsilon_probe, plan.sigma_score, plan.epsilon_final * 1.01, 5e-8,
                          orders_for(eps, 5e-8))
    assert over > eps


def test_eq_t1_is_max_of_the_two_parts_plus_the_final_curve():
    orders = np.arange(2, 50)
    a, b, f, g = (orders * c for c in (0.01, 0.02, 0.05, 0.04))
    np.testing.assert_allclose(search_rdp(orders, [a, b], 1e9, [f, g]), a + b + f)  # score free: training part
    sig = math.sqrt(1 / (2 * 0.1))  # each score λ·0.1: 2 of them 0.2·λ > 0.03·λ
    np.testing.assert_allclose(search_rdp(orders, [a, b], sig, [f, g]), 0.2 * orders + f)
    np.testing.assert_allclose(search_rdp(orders, [], 1.0, [g]), g)  # the fallback: the training alone


def test_the_centre_is_always_the_first_candidate_and_the_list_differs_where_it_matters():
    for task in ("binary", "regression", "multiclass"):
        for cyc in (True, False):
            for numeric in (True, False):
                centre = {**CENTRE, "cyclical": cyc}
                space = shortlist(centre, task, numeric)
                assert space[0] == centre
                assert len(space) == len({json.dumps(x, sort_keys=True) for x in space})
                assert any(c["cyclical"] != cyc for c in space)  # the flip is always checked
                deep = DEEP["regression" if task == "regression" else "classification"]
                if numeric:  # non-cyclical deep trees beat cyclical ones on all-numeric data
                    assert any({k: c[k] for k in deep} == deep for c in space)
                assert all(c["learning_rate"] == 0.1 and c["subsample"] == 0.3 for c in space)  # no γ/η neighbours


def test_search_only_where_the_budget_affords_it():
    edge = 10 ** MIN_BUDGET_LOG10
    assert not should_search(1.0, int(edge) - 1) and should_search(1.0, int(edge))
    assert should_search(2.0, int(edge / 2)) and not should_search(2.0, int(edge / 2) - 1)  # ε·n, not n
    assert not should_search(1.0, int(edge), classes=3)  # ε·n/K for K classes
    plan = plan_tuning([CENTRE], 0.5, 5e-8)
    assert not plan.searches and plan.epsilon_final == plan.epsilon == 0.5 and plan.sigma_score == 0


def test_holdout_depends_only_on_each_record_id_and_the_key():
    ids = np.random.default_rng(2).choice(2**62, size=10_000, replace=False).astype(np.int64) - 2**61
    key = fresh_split_key()
    assert len(key) == 32 and key != fresh_split_key()  # a fresh secret per run
    m = holdout_mask(ids, key)
    assert 0.18 < m.mean() < 0.22
    np.testing.assert_array_equal(holdout_mask(ids[::3], key), m[::3])  # other records do not move a record
    np.testing.assert_array_equal(holdout_mask(ids[::-1], key), m[::-1])  # nor does their order
    assert not np.array_equal(holdout_mask(ids, fresh_split_key()), m)
    with pytest.raises(ValueError, match="split key"):
        holdout_mask(ids, b"short")


def test_scores_lie_in_the_unit_interval():
    y = np.array([0.0, 1.0, 1.0])
    s = record_scores("binary", y, np.array([0.0, 0.0, 0.5]))
    np.testing.assert_allclose(s, [1.0, 0.0, 0.75])
    s = record_scores("multiclass", np.array([0, 2]), np.array([[1, 0, 0], [1, 0, 0.0]]))
    np.testing.assert_allclose(s, [1.0, 0.0])
    s = record_scores("regression", np.array([0.0, 0.0]), np.array([5.0, 100.0]), (0.0, 10.0))
    np.testing.assert_allclose(s, [0.75, 0.0])


def test_candidates_centre_first_and_distinct():
    c = candidates(dict(trees=100, depth=6, subsample=0.3, learning_rate=0.1, cyclical=False))
    assert c[0]["trees"] == 100 and len(c) == len({json.dumps(x, sort_keys=True) for x in c}) >= 8


def spy_on_training(monkeypatch) -> list[tuple[int, float]]:
    """(records, ε target) of every training run the engine does from now on (the real training runs)."""
    from fedsbdt.common import engine

    seen, real = [], engine.train

    def train(dataset, hp, *a, **kw):
        seen.append((dataset.n, hp.epsilon))
        return real(dataset, hp, *a, **kw)

    monkeypatch.setattr(engine, "train", train)
    return seen


def test_small_budget_tune_is_auto_trained_on_every_record_with_all_of_epsilon(tmp_path, capsys, monkeypatch):
    """Below ε·n = 10³ tune must be what fedsbdt train does: the same hyperparameters (auto's, λ included), the
    same receipt ε, one training on every record, and it says so; an impossible budget is refused with one line,
    nothing written."""
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path / "data")
    seen = spy_on_training(monkeypatch)
    out, ref = tmp_path / "m.json", tmp_path / "train.json"
    argv = ["tune", "--data", str(data), "--schema", str(schema), "--out", str(out), "--rows", "400"]
    assert main([*argv, "--epsilon", "1e-9", "--quiet"]) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedsbdt tune: error:"), err
    assert main([*argv, "--epsilon", "1"]) == 0
    assert seen == [(400, 1.0)]  # no probe: one run, every record, all of ε
    text = capsys.readouterr().out
    assert "too small to pay for a check" in text and "what fedsbdt train does" in text
    assert main(["train", "--data", str(data), "--schema", str(schema), "--out", str(ref), "--rows", "400",
                 "--epsilon", "1", "--quiet"]) == 0
    capsys.readouterr()
    model, plain = json.loads(out.read_text()), json.loads(ref.read_text())
    t = model["training"]["tuning"]
    assert t["searched"] is False and t["candidates"] == [t["settings"]] and t["epsilon_final"] == 1
    drop = {"seed"}
    assert ({k: v for k, v in model["hyperparameters"].items() if k not in drop}
            == {k: v for k, v in plain["hyperparameters"].items() if k not in drop})
    assert model["privacy"]["epsilon"] == plain["privacy"]["epsilon"] <= 1


def test_tune_searches_at_a_larger_budget_and_its_receipt_is_the_plans(tmp_path, capsys, monkeypatch):
    """ε·n = 1500: three probes on the training part at 0.2·ε each, then the released model on every record."""
    from fedsbdt.common.auto import resolve
    from fedsbdt.common.schema import Schema
    from fedsbdt.common.tuning import plan_for

    from fedsbdt.cli import main

    data, schema = write_task(tmp_path / "data", n=1500)
    out = tmp_path / "m.json"
    seen = spy_on_training(monkeypatch)
    assert main(["tune", "--data", str(data), "--schema", str(schema), "--out", str(out), "--rows", "1500",
                 "--epsilon", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)  # exactly one JSON object
    model = json.loads(out.read_text())
    assert res["epsilon"] == model["privacy"]["epsilon"] and res["tuning"] == model["training"]["tuning"]
    t = model["training"]["tuning"]
    plan, _ = plan_for(Schema.load(schema), 1.0, 5e-8, 1500)
    assert t["searched"] and model["privacy"]["epsilon"] == pytest.approx(plan.epsilon) and plan.epsilon <= 1
    keys, choice = resolve({"epsilon": 1.0}, Schema.load(schema), 1500)  # fedsbdt train --rows 1500 --epsilon 1
    assert t["candidates"][0] == {k: keys[k] for k in choice.settings if k != "l2"}  # auto's own setting first
    assert len(t["candidates"]) == 3 and t["settings"] in t["candidates"] and "'pid'" in t["holdout"]
    assert t["epsilon_probe"] == pytest.approx(0.2) and t["epsilon_final"] > 0.8
    hp = model["hyperparameters"]
    assert {k: hp[k] for k in t["settings"]} == t["settings"] and hp["epsilon"] == t["epsilon_final"]
    probes, final = seen[:-1], seen[-1]
    assert len(probes) == 3 and all(e == pytest.approx(0.2) and 0.7 * 1500 < n < 0.9 * 1500 for n, e in probes)
    assert final == (1500, t["epsilon_final"])  # the released model saw every record
    assert main(["report", "--model", str(out), "--out", str(tmp_path / "r.html")]) == 0  # the report names them
    page = (tmp_path / "r.html").read_text()
    assert "private tuning" in page and "candidate 1 (auto)" in page and page.count(">chosen<") == 1


def test_pick_keeps_auto_unless_an_alternative_beats_it_by_the_margin():
    from fedsbdt.common.tuning import pick

    unit = math.sqrt(2) * 2**20  # one noise std of a difference at σ_s = 1
    assert pick([0], 1.0) == 0  # the centre alone
    assert pick([5, 5, 5], 1.0, 0.0) == 0  # ties: the centre
    assert pick([0, int(0.9 * unit), 0], 1.0) == 0  # within the margin: the centre
    assert pick([0, int(0.9 * unit), int(1.1 * unit)], 1.0) == 2  # beyond it: the best alternative
    assert pick([0, 1, 2], 1.0, 0.0) == 2 and pick([3, 1, 2], 1.0, 0.0) == 0  # margin 0: the highest
    assert pick([0, int(1.1 * unit)], 2.0) == 0  # the margin scales with σ_s


# --------------------------------------------------------------------------- what fedsbdt tune releases (issue 37)

FORBIDDEN = {"trials", "trials_run", "winner", "winner_noisy_score_sum", "scores", "score_sum", "ranking",
             "holdout_seed", "seconds", "elapsed"}


def write_task(folder, n: int = 400, id_column: bool = True):
    """A small binary task: a CSV with a stable id column (shuffled large integers, not row numbers) and its
    schema, with or without ``id_column``.  Returns (data path, schema path)."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    x = rng.uniform(0, 1, (n, 3))
    y = (x[:, 0] + x[:, 1] * x[:, 2] + 0.3 * rng.normal(size=n) > 0.8).astype(int)
    ids = rng.choice(10**9, size=n, replace=False) + 10**6
    rows = ["pid,a,b,c,y"] + [f"{i},{u:.6f},{v:.6f},{w:.6f},{t}" for i, (u, v, w), t in zip(ids, x, y)]
    (folder / "d.csv").write_text("\n".join(rows) + "\n")
    features = "".join(f'\n[[features]]\nname = "{c}"\ntype = "numeric"\nrange = [0, 1]\n' for c in "abc")
    (folder / "s.toml").write_text('name = "small"\ntask = "binary"\ntarget = "y"\n'
                                   + ('id_column = "pid"\n' if id_column else "")
                                   + '\n[format]\nheader = true\nseparator = ","\n' + features)
    return folder / "d.csv", folder / "s.toml"


def keys_anywhere(obj) -> set[str]:
    """Every key of every dict in a parsed JSON document."""
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in keys_anywhere(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in keys_anywhere(v)}
    return set()


def test_tune_releases_the_final_model_and_the_receipt_but_no_score_or_ranking(tmp_path, capsys, monkeypatch):
    """The model file, --json, the text output and the log (debug level) must hold no score, no ranking and no
    winner index.  The probes' noisy scores are forced so that the first and then the third candidate wins:
    everything tune writes must be the same except what belongs to the released model itself."""
    import re

    from fedsbdt.common import tuning
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path / "data", n=1500)

    def run(w: int, json_out: bool):
        folder = tmp_path / f"w{w}-{'json' if json_out else 'text'}"
        folder.mkdir()
        monkeypatch.chdir(folder)
        calls = []

        def forced(*a, **kw):  # the w-th probe scores highest
            calls.append(1)
            return 10**9 if len(calls) - 1 == w else 0

        monkeypatch.setattr(tuning, "noisy_score", forced)
        argv = ["--log-level", "debug", "tune", "--data", str(data), "--schema", str(schema), "--epsilon", "1",
                "--rows", "1500", "--out", "m.json"] + (["--json"] if json_out else [])
        assert main(argv) == 0
        assert len(calls) == 3  # every candidate was probed
        cap = capsys.readouterr()
        return cap.out, cap.err, json.loads((folder / "m.json").read_text())

    setting_text = re.compile(r"T=\d+ depth=\d+ γ=\S+ η=\S+ (not )?cyclical")
    texts = {}
    for w in (0, 2):
        out, err, text_model = run(w, json_out=False)
        for text in (out, err):
            assert not re.search(r"winner|score =|score:|rank|probe \d", text), text
        texts[w] = (setting_text.sub("SETTINGS", out), err.count("\n"))
        out, err, model = run(w, json_out=True)
        res = json.loads(out)  # exactly one JSON object
        assert not re.search(r"winner|score =|score:|rank|probe \d", err), err
        for doc in (res, model, text_model):
            assert not keys_anywhere(doc) & FORBIDDEN, keys_anywhere(doc) & FORBIDDEN
        t = model["training"]["tuning"]
        assert t["settings"] == t["candidates"][w] and res["settings"] == t["settings"]
        assert {key: model["hyperparameters"][key] for key in t["settings"]} == t["settings"]
        texts[w, "json"] = ({key: v for key, v in res.items() if key != "settings"} | {"tuning": None},
                            {key: v for key, v in t.items() if key != "settings"},
                            {key: model["privacy"][key] for key in ("epsilon", "delta", "guarantee")})
    assert texts[0] == texts[2]  # the text output and the number of log lines do not depend on the winner
    assert texts[0, "json"] == texts[2, "json"]


def test_tune_without_an_id_column_exits_2_with_one_line(tmp_path, capsys):
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path, id_column=False)
    out = tmp_path / "m.json"
    rc = main(["tune", "--data", str(data), "--schema", str(schema), "--epsilon", "1", "--rows", "400",
               "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "id_column" in err and err.startswith("fedsbdt tune: error:")
    assert not out.exists()


class _Captured(Exception):
    pass


@pytest.mark.parametrize("which", ["id column", "bundled abalone"])
def test_deleting_one_row_moves_no_other_record_between_training_and_held_out(tmp_path, capsys, monkeypatch, which):
    """Run ``fedsbdt tune`` on a file and on the same file without one row, with the same split key in both runs
    (the key is drawn independently of the data, so the two runs may be coupled on it), and stop it where the
    trials would start: every other record must be on the same side in both.  With an id column the split is a
    keyed hash of each record's id; the bundled Abalone example has none, so tune must refuse it (its row numbers
    would move about a third of the records when one row is deleted)."""
    from pathlib import Path

    from fedsbdt.common import tuning
    from fedsbdt.cli import main

    if which == "id column":
        data, schema = write_task(tmp_path / "data", n=1000)
        header, lines = 1, data.read_text().splitlines()
    else:
        ex = Path(__file__).resolve().parents[1] / "examples" / "abalone"
        data, schema = ex / "abalone.data", ex / "schema.toml"
        header, lines = 0, data.read_text().splitlines()
    fewer = tmp_path / "fewer.csv"
    gone = header + 3  # an early row: with row numbers, every later record's number moves
    fewer.write_text("\n".join(lines[:gone] + lines[gone + 1:]) + "\n")

    real_tune_on, key = tuning.tune_on, []

    def same_key(ds, plan, randomness, k, *rest, **kw):
        key.append(k)
        return real_tune_on(ds, plan, randomness, key[0], *rest, **kw)

    def capture(ds, holdout, *a, **kw):
        train_ds, holdout_ds = ds.subset(~holdout), ds.subset(holdout)
        raise _Captured({tuple(r) for r in np.column_stack([train_ds.X, train_ds.y])},
                        {tuple(r) for r in np.column_stack([holdout_ds.X, holdout_ds.y])})

    monkeypatch.setattr(tuning, "tune_on", same_key)
    monkeypatch.setattr(tuning, "run_tuning", capture)

    def sides(path):
        argv = ["tune", "--data", str(path), "--schema", str(schema), "--epsilon", "4", "--rows", "4000",
                "--out", str(tmp_path / "m.json"), "--quiet"]
        try:
            rc = main(argv)
        except _Captured as c:
            return c.args
        err = capsys.readouterr().err
        assert rc == 2 and "id_column" in err, err  # refused: there is no split to compare
        return None

    a, b = sides(data), sides(fewer)
    if which == "id column":
        assert a is not None and b is not None and 0.15 < len(a[1]) / 1000 < 0.25
    if a is None or b is None:
        return
    (train_a, held_a), (train_b, held_b) = a, b
    moved = (train_a & held_b) | (held_a & train_b)
    assert len(moved) == 0, f"{len(moved)} of {len(train_b | held_b)} other records moved between training and held-out"
    assert len((train_a | held_a) - (train_b | held_b)) == 1  # only the deleted record is missing


def test_quiet_tune_prints_the_result_in_one_line(tmp_path, capsys):
    """``--quiet`` (issue 36): one line for the result, not every probe's settings."""
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path / "data")
    out = tmp_path / "m.json"
    assert main(["tune", "--data", str(data), "--schema", str(schema), "--out", str(out),
                 "--rows", "400", "--quiet", "--epsilon", "2"]) == 0
    printed = capsys.readouterr()
    (line,) = printed.out.splitlines()
    assert line.startswith("tuned privately: ") and line.endswith(f"-DP; model written to {out}") and printed.err == ""


def test_a_plan_refuses_what_it_cannot_mean():
    from fedsbdt.common.tuning import TuningPlan

    ok = dict(candidates=(CENTRE, {**CENTRE, "cyclical": False}), epsilon_probe=0.2, sigma_score=20.0,
              epsilon_final=0.9, epsilon=1.0, delta=5e-8, order=30)
    assert TuningPlan(**ok).searches
    for bad in (dict(candidates=()), dict(epsilon_final=1.1), dict(epsilon_final=0.0), dict(delta=1.0),
                dict(sigma_score=0.0), dict(epsilon_probe=0.0), dict(switch_margin=-1.0),
                dict(switch_margin=math.inf)):
        with pytest.raises(ValueError):
            TuningPlan(**{**ok, **bad})


def test_tune_with_a_dp_row_count_states_its_share(tmp_path, capsys):
    """Without --rows the gate reads a DP count (2 % of ε); the receipt covers it and stays ≤ ε."""
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path / "data")
    out = tmp_path / "m.json"
    assert main(["tune", "--data", str(data), "--schema", str(schema), "--out", str(out), "--epsilon", "1",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    p = json.loads(out.read_text())["privacy"]
    assert p["eps_rows"] == pytest.approx(0.02) and res["epsilon"] == p["epsilon"] <= 1
    assert res["searched"] is False  # ε·n ≈ 400 < 10³: auto
