"""Greedy vs random tree training speed on many-level categorical data (issue 21 item 4).

Data: a synthetic binary set of the issue's shape, generated from a fixed public
seed — 200,000 rows, 40 features: 7 numeric (uniform on [0, 1]) and 33
categorical with 2…52 levels (evenly spread), the label a logistic draw from
interacting features (numeric × numeric, categorical level groups × numeric,
categorical × categorical), so greedy trees have something to find.

Both builders are trained centrally with the engine ``fedsbdt train`` runs
(:func:`fedsbdt.common.engine.train`, ``SecureRandomness``: the real noise and
our exact exponential mechanism), 100 trees of depth 5, ε = 1, every other
hyperparameter at the CLI's defaults for the builder (greedy: ``--subsample 1
--split-candidates 32 --no-cyclical``, exponential mechanism; random: S-BDT's
γ = 0.1, cyclical).  Each configuration is first trained once as a warm-up (numba
compiles, the codes of the grid are cached per process only, so the warm-up
is a 3-tree run on the same data), then ``--repeat`` times; the median wall
time is reported.  The two builders are timed alternately (random, greedy,
random, greedy, …) so both see the same load of this shared machine; the
ratio of the medians and the median of the back-to-back ratios are both given,
with ``os.getloadavg()`` before and after.

``--cli`` times what a user runs instead: ``fedsbdt train --settings paper --tree-builder B --trees 100 --depth 5
--epsilon 1`` on the same data written as a CSV file and a schema, each a fresh process (reading the file,
numba's cached kernels, training, writing the model), alternately, the median of ``--repeat``.

Run:  python benchmarks/greedy_speed.py [--rows 200000] [--trees 100] [--repeat 3]
      python benchmarks/greedy_speed.py --cli            # end to end through the CLI → greedy_speed_cli.json
      python benchmarks/greedy_speed.py --profile      # cProfile of one greedy run, top 25
      python benchmarks/greedy_speed.py --selection histogram   # noisy level histograms (the federated rule)
Writes ``benchmarks/results/greedy_speed.json`` (``greedy_speed_histogram.json`` with ``--selection histogram``).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import time

import numpy as np

from _util import save  # noqa: E402  (puts the repository on sys.path)

from fedsbdt.common.modes.greedy.builder import GreedyTrees  # noqa: E402
from fedsbdt.common.config import Hyperparameters, builder_defaults  # noqa: E402
from fedsbdt.common.data import Dataset  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.randomness import SecureRandomness  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402

SEED = 20261127
NUMERIC, CATEGORICAL, MAX_LEVELS = 7, 33, 52


def synthetic(rows: int, seed: int = SEED) -> Dataset:
    """The issue's shape: ``rows`` records, 7 numeric + 33 categorical features with 2…52 levels, a binary
    label from interacting features (a fixed public seed)."""
    rng = np.random.default_rng(seed)
    levels = np.linspace(2, MAX_LEVELS, CATEGORICAL).round().astype(int)
    num = rng.random((rows, NUMERIC))
    cat = np.stack([rng.integers(0, k, rows) for k in levels], axis=1)
    effect = [rng.normal(0, 1, k) for k in levels]  # per-level effects of the categorical features
    logit = (2.0 * (num[:, 0] - 0.5) * (num[:, 1] - 0.5) * 8
             + effect[-1][cat[:, -1]] * (num[:, 2] > 0.5)
             + effect[-2][cat[:, -2]] * effect[5][cat[:, 5]]
             + 1.5 * (num[:, 3] > 0.7) - 0.5)
    y = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float64)
    feats = [{"name": f"x{j}", "type": "numeric", "range": [0.0, 1.0]} for j in range(NUMERIC)]
    feats += [{"name": f"c{j}", "type": "categorical", "levels": [str(i) for i in range(k)]}
              for j, k in enumerate(levels)]
    schema = Schema.from_dict({"name": "greedy-speed", "task": "binary", "target": "y", "features": feats},
                              source="greedy_speed.py")
    X = np.empty((rows, NUMERIC + CATEGORICAL), dtype=object)
    X[:, :NUMERIC] = num
    X[:, NUMERIC:] = cat  # level codes, read as the level names "0", "1", …
    return Dataset.from_arrays(X, y, schema, source="greedy_speed.py")


def hyperparameters(builder: str, trees: int, selection: str = "exponential") -> Hyperparameters:
    """What ``fedsbdt train --tree-builder BUILDER --trees T --depth 5 --epsilon 1 [--selection S]`` uses."""
    given = {"tree_builder": builder, "trees": trees, "depth": 5, "epsilon": 1.0}
    if builder == "greedy":
        given["selection"] = selection
    return Hyperparameters().replace(**builder_defaults(given))


class TimedRandomness(SecureRandomness):
    """``SecureRandomness`` that adds up the wall time of its exact exponential-mechanism draws."""

    em_seconds: float = 0.0

    def exponential_mechanism(self, scores, scale, sensitivity):
        t0 = time.perf_counter()
        try:
            return super().exponential_mechanism(scores, scale, sensitivity)
        finally:
            self.em_seconds += time.perf_counter() - t0


def timed(ds: Dataset, hp: Hyperparameters) -> tuple[float, float, float]:
    """(wall seconds of one training, its CPU seconds, wall seconds in the exponential mechanism's sampler)."""
    r = TimedRandomness()
    t0, c0 = time.perf_counter(), time.process_time()
    train(ds, hp, randomness=r)
    return time.perf_counter() - t0, time.process_time() - c0, r.em_seconds


def cli_times(ds: Dataset, trees: int, repeat: int) -> dict:
    """Wall seconds of ``fedsbdt train`` per builder (fresh processes, alternately; median of ``repeat``)."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import pandas as pd

    from fedsbdt.common.federation.toml_writer import dumps

    d = Path(tempfile.mkdtemp(prefix="greedy-speed-"))
    names = [f.name for f in ds.schema.features]
    frame = pd.DataFrame(ds.X, columns=names)
    for j, f in enumerate(ds.schema.features):
        if f.is_categorical:  # the level names "0", "1", … (the codes)
            frame[f.name] = ds.X[:, j].astype(int)
    frame["y"] = ds.y.astype(int)
    frame.to_csv(d / "data.csv", index=False)
    (d / "schema.toml").write_text(dumps(ds.schema.to_dict()))
    times: dict[str, list[float]] = {"random": [], "greedy": []}
    reported: dict[str, list[float]] = {"random": [], "greedy": []}  # the "seconds" train prints: training alone
    for i in range(repeat + 1):  # the first round warms numba's cache and the page cache, not counted
        for b in times:
            cmd = [sys.executable, "-m", "fedsbdt.cli", "train", "--data", str(d / "data.csv"), "--schema",
                   str(d / "schema.toml"), "--out", str(d / f"{b}.json"), "--settings", "paper", "--tree-builder", b,
                   "--trees", str(trees), "--depth", "5", "--epsilon", "1", "--quiet", "--json"]
            t0 = time.perf_counter()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            if i:
                times[b].append(time.perf_counter() - t0)
                reported[b].append(json.loads(out)["seconds"])
        if i:
            print(f"cli run {i}: random {times['random'][-1]:.2f} s ({reported['random'][-1]:.2f} s training), greedy "
                  f"{times['greedy'][-1]:.2f} s ({reported['greedy'][-1]:.2f} s training)", flush=True)
    med = {b: statistics.median(t) for b, t in times.items()}
    rep = {b: statistics.median(t) for b, t in reported.items()}
    return {"rows": ds.n, "trees": trees, "depth": 5, "epsilon": 1.0, "seconds": {b: round(m, 3) for b, m in med.items()},
            "runs": {b: [round(x, 3) for x in t] for b, t in times.items()},
            "ratio_of_medians": round(med["greedy"] / med["random"], 3),
            "training_seconds": {b: round(m, 3) for b, m in rep.items()},
            "training_ratio_of_medians": round(rep["greedy"] / rep["random"], 3), "loadavg": list(os.getloadavg()),
            "command": "fedsbdt train --settings paper --tree-builder B --trees T --depth 5 --epsilon 1 --quiet --json"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--selection", choices=("exponential", "histogram"), default="exponential",
                    help="greedy node selection (histogram: noisy level histograms, the federated rule)")
    ap.add_argument("--profile", action="store_true", help="cProfile one greedy run instead (top 25, cumulative)")
    ap.add_argument("--no-save", action="store_true", help="print only (a quick run)")
    ap.add_argument("--cli", action="store_true", help="time `fedsbdt train` end to end instead")
    args = ap.parse_args()

    t0 = time.perf_counter()
    ds = synthetic(args.rows)
    print(f"data: {ds.n} rows, {ds.schema.n_features} features ({time.perf_counter() - t0:.1f} s to build)",
          flush=True)
    if args.cli:
        result = cli_times(ds, args.trees, args.repeat)
        print(f"fedsbdt train: random {result['seconds']['random']:.2f} s, greedy {result['seconds']['greedy']:.2f} s: "
              f"greedy/random = {result['ratio_of_medians']:.2f} end to end, "
              f"{result['training_ratio_of_medians']:.2f} in the training seconds train reports")
        if not args.no_save:
            print(f"saved {save('greedy_speed_cli', result)}")
        return
    hps = {b: hyperparameters(b, args.trees, args.selection) for b in ("random", "greedy")}
    for b, hp in hps.items():  # warm-up: numba compiles
        train(ds, hp.replace(trees=3))
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        train(ds, hps["greedy"])
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return

    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"random": [], "greedy": []}
    cpu: dict[str, list[float]] = {"random": [], "greedy": []}
    em: list[float] = []
    for i in range(args.repeat):
        for b, hp in hps.items():
            wall, cpu_s, em_s = timed(ds, hp)
            times[b].append(wall)
            cpu[b].append(cpu_s)
            if b == "greedy":
                em.append(em_s)
        print(f"run {i + 1}: random {times['random'][-1]:.2f} s ({cpu['random'][-1]:.2f} s CPU), greedy "
              f"{times['greedy'][-1]:.2f} s ({cpu['greedy'][-1]:.2f} s CPU) "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
    load_after = os.getloadavg()
    med = {b: statistics.median(t) for b, t in times.items()}
    pair_ratios = [g / r for g, r in zip(times["greedy"], times["random"])]
    cand = GreedyTrees(ds.schema, hps["greedy"], 1.0).candidates
    levels = [len(f.levels) for f in ds.schema.features if f.is_categorical]
    result = {
        "rows": ds.n, "features": ds.schema.n_features, "numeric": NUMERIC, "categorical": CATEGORICAL,
        "levels_min": min(levels), "levels_max": max(levels), "levels_total": sum(levels),
        "greedy_candidates": int(cand.feature.size), "trees": args.trees, "depth": 5, "epsilon": 1.0,
        "seconds": {b: round(m, 3) for b, m in med.items()},
        "runs": {b: [round(x, 3) for x in t] for b, t in times.items()},
        "cpu_seconds": {b: round(statistics.median(c), 3) for b, c in cpu.items()},
        "cpu_ratio_of_medians": round(statistics.median(cpu["greedy"]) / statistics.median(cpu["random"]), 3),
        "greedy_exponential_mechanism_seconds": round(statistics.median(em), 3),
        "ratio_of_medians": round(med["greedy"] / med["random"], 3),
        "ratio_back_to_back_median": round(statistics.median(pair_ratios), 3),
        "ratios_back_to_back": [round(x, 3) for x in pair_ratios],
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in load_after],
        "hyperparameters": {b: {k: hp.to_dict()[k] for k in ("tree_builder", "selection", "subsample",
                                                             "split_candidates", "cyclical", "trees", "depth")}
                            for b, hp in hps.items()},
    }
    print(f"random {med['random']:.2f} s, greedy {med['greedy']:.2f} s: greedy/random = "
          f"{result['ratio_of_medians']:.2f} (back-to-back median {result['ratio_back_to_back_median']:.2f}; "
          f"{result['greedy_exponential_mechanism_seconds']:.2f} s of greedy in the exponential mechanism); "
          f"load average {load_before[0]:.2f} → {load_after[0]:.2f}")
    if not args.no_save:
        name = "greedy_speed" if args.selection == "exponential" else "greedy_speed_histogram"
        print(f"saved {save(name, result)}")


if __name__ == "__main__":
    main()
