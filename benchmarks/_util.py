"""Shared pieces of the S-BDT benchmarks: paper settings, repeated k-fold CV, result files."""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.data import Dataset, load  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.metrics import auc, rmse  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402

DATASETS = Path(os.environ.get("FEDSBDT_DATASETS", ROOT.parent / "shared" / "datasets"))
RESULTS = Path(__file__).resolve().parent / "results"

#: Paper Fig. 4 ablation settings as the reference code runs them (see the issue).
SETTINGS = {
    "abalone": dict(epsilon=0.105, trees=150, depth=2, subsample=0.1, r1=0.2, init_share=0.1, eps_ds=0.005,
                    grad_clip=0.1, l2=15.0, learning_rate=0.1, leaf_clip=2.0, label_clip=1.0, cyclical=True,
                    split_candidates=32),
    "adult": dict(epsilon=0.02, trees=200, depth=5, subsample=0.005, r1=0.1, grad_clip=0.5, hess_clip=0.1, l2=10.0,
                  learning_rate=0.1, init_share=0.0, cyclical=True, split_candidates=32),
}
#: what the paper (Table 2, 200 runs) and the reference C++ code under this protocol report
PUBLISHED = {
    "abalone": {"metric": "rmse", "paper": (2.745, 0.008), "reference_cpp": (2.751, 0.013)},
    "adult": {"metric": "auc", "paper": (0.825, 0.001), "reference_cpp": (0.832, 0.002)},
}
FOLDS = 5
#: public seed of the CV shuffles (repeat r uses SHUFFLE_SEED + r); split seeds are public too
SHUFFLE_SEED = 20240601


def data_file(name: str) -> Path:
    """``../shared/datasets/<name>.data`` in a development checkout, else the identical copy in ``examples/``."""
    shared = DATASETS / f"{name}.data"
    return shared if shared.exists() else ROOT / "examples" / name / f"{name}.data"


def load_dataset(name: str) -> Dataset:
    return load(data_file(name), Schema.load(ROOT / "examples" / name / "schema.toml"))


def metric_of(name: str) -> str:
    return PUBLISHED[name]["metric"]


def cv_runs(n: int, repeats: int, folds: int = FOLDS):
    """Yield ``(repeat, fold, train_idx, test_idx)`` of ``repeats`` × ``folds``-fold CV, shuffled by a public seed."""
    for r in range(repeats):
        perm = np.random.default_rng(SHUFFLE_SEED + r).permutation(n)
        parts = np.array_split(perm, folds)
        for k in range(folds):
            test = np.sort(parts[k])
            train_idx = np.sort(np.concatenate([parts[j] for j in range(folds) if j != k]))
            yield r, k, train_idx, test


def split_seed(repeat: int, fold: int) -> int:
    return 1_000_003 * (repeat + 1) + fold


def evaluate(model, ds: Dataset, metric: str) -> float:
    if metric == "rmse":
        return rmse(ds.y, model.predict(ds.X))
    return auc(ds.y, model.predict_margin(ds.X))


def run_cv(ds: Dataset, hp: Hyperparameters, metric: str, repeats: int, randomness_factory=None,
           progress: bool = False) -> dict:
    """Train/test on every fold of ``repeats`` × 5-fold CV; returns the per-run metric and summary."""
    values, seconds = [], []
    t0 = time.perf_counter()
    for r, k, tr, te in cv_runs(ds.n, repeats):
        rnd = randomness_factory() if randomness_factory else None
        res = train(ds.subset(tr), hp.replace(seed=split_seed(r, k)), randomness=rnd)
        values.append(evaluate(res.model, ds.subset(te), metric))
        seconds.append(res.seconds)
        if progress:
            print(f"\r  run {len(values)}/{repeats * FOLDS}: {metric} {values[-1]:.4f}", end="", file=sys.stderr,
                  flush=True)
    if progress:
        print(file=sys.stderr)
    return summary(values) | {"train_seconds_mean": float(np.mean(seconds)),
                              "wall_seconds": time.perf_counter() - t0, "values": [float(v) for v in values]}


def summary(values) -> dict:
    v = np.asarray(values, dtype=float)
    sd = float(v.std(ddof=1)) if v.size > 1 else float("nan")
    return {"runs": int(v.size), "mean": float(v.mean()), "std": sd, "se": sd / math.sqrt(v.size)}


def environment() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "common"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {"commit": commit, "common_dirty": dirty, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def spawn_child(script: str, kind: str, spec: dict, env: dict) -> dict:
    """Run ``script --child kind spec`` in a fresh process and return the JSON object it prints last."""
    p = subprocess.run([sys.executable, script, "--child", kind, json.dumps(spec)], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"child {kind} {spec} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload | {"environment": environment()}, indent=2, allow_nan=True) + "\n")
    return path


def fmt_pm(mean: float, se: float, digits: int = 3) -> str:
    return f"{mean:.{digits}f} ± {se:.{digits}f}"
