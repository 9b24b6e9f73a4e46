"""Build a small synthetic OMOP-like cohort in PostgreSQL (docs/data-sources.md walks through it).

    python examples/omop/build_cohort.py --db postgresql://USER@HOST:PORT/DB [--persons 2000] [--seed 1]

Creates (replacing them) four tables of the OHDSI OMOP Common Data Model, with the columns a cohort query
needs and the standard concept ids: ``person`` (gender 8507 male / 8532 female, year of birth),
``visit_occurrence`` (9201 inpatient, 9202 outpatient, 9203 emergency room), ``condition_occurrence``
(201826 type 2 diabetes, 316866 hypertension, 4329847 myocardial infarction) and ``measurement``
(3038553 body mass index, 3004249 systolic blood pressure, 3004410 HbA1c).  The records are random: no real
person is in them.  Myocardial infarction is more likely with age, male sex, diabetes, hypertension, blood
pressure and BMI, so the flattened cohort (cohort.sql) has something to learn.  Credentials as for
``fedsbdt``: libpq's environment or ~/.pgpass, never in the URL.
"""
from __future__ import annotations

import argparse
import io
from datetime import date, timedelta

import numpy as np

TABLES = {
    "person": "person_id bigint PRIMARY KEY, gender_concept_id integer NOT NULL, year_of_birth integer NOT NULL, "
              "race_concept_id integer NOT NULL",
    "visit_occurrence": "visit_occurrence_id bigint PRIMARY KEY, person_id bigint NOT NULL, "
                        "visit_concept_id integer NOT NULL, visit_start_date date NOT NULL",
    "condition_occurrence": "condition_occurrence_id bigint PRIMARY KEY, person_id bigint NOT NULL, "
                            "condition_concept_id integer NOT NULL, condition_start_date date NOT NULL",
    "measurement": "measurement_id bigint PRIMARY KEY, person_id bigint NOT NULL, measurement_concept_id integer "
                   "NOT NULL, value_as_number numeric, measurement_date date NOT NULL",
}
MALE, FEMALE = 8507, 8532
INPATIENT, OUTPATIENT, ER = 9201, 9202, 9203
DIABETES, HYPERTENSION, MI = 201826, 316866, 4329847
BMI, SBP, HBA1C = 3038553, 3004249, 3004410


def synthesize(n: int, seed: int, first_id: int = 1) -> dict[str, list[tuple]]:
    rng = np.random.default_rng(seed)
    start = date(2015, 1, 1)
    out: dict[str, list[tuple]] = {t: [] for t in TABLES}
    ids = {"visit_occurrence": 1, "condition_occurrence": 1, "measurement": 1}

    def add(table, *row):
        out[table].append((first_id * 1000 + ids[table], *row))
        ids[table] += 1

    for k in range(n):
        pid = first_id + k
        male = rng.random() < 0.5
        born = int(rng.integers(1930, 2000))
        age = 2020 - born
        out["person"].append((pid, MALE if male else FEMALE, born, int(rng.choice([8527, 8516, 8515, 0]))))
        diabetes = rng.random() < 0.05 + 0.004 * max(age - 30, 0)
        hypertension = rng.random() < 0.1 + 0.006 * max(age - 30, 0)
        bmi = rng.normal(27 + 3 * diabetes, 5)
        sbp = rng.normal(120 + 0.4 * (age - 40) + 15 * hypertension, 14)
        visits = int(rng.poisson(2 + 2 * diabetes + hypertension))
        for _ in range(visits):
            add("visit_occurrence", pid, int(rng.choice([INPATIENT, OUTPATIENT, ER], p=[0.15, 0.7, 0.15])),
                start + timedelta(days=int(rng.integers(0, 2000))))
        for has, concept in ((diabetes, DIABETES), (hypertension, HYPERTENSION)):
            if has:
                add("condition_occurrence", pid, concept, start + timedelta(days=int(rng.integers(0, 2000))))
        logit = -6.5 + 0.05 * age + 0.6 * male + 0.8 * diabetes + 0.6 * hypertension + 0.02 * (sbp - 120) \
            + 0.04 * (bmi - 27)
        if rng.random() < 1 / (1 + np.exp(-logit)):
            add("condition_occurrence", pid, MI, start + timedelta(days=int(rng.integers(0, 2000))))
        for concept, value, p_measured in ((BMI, bmi, 0.85), (SBP, sbp, 0.9)):
            for _ in range(int(rng.integers(1, 4)) if rng.random() < p_measured else 0):  # some never measured
                add("measurement", pid, concept, round(float(value + rng.normal(0, 1)), 1),
                    start + timedelta(days=int(rng.integers(0, 2000))))
        if diabetes or rng.random() < 0.3:
            add("measurement", pid, HBA1C, round(float(rng.normal(7.5 if diabetes else 5.4, 0.6)), 1),
                start + timedelta(days=int(rng.integers(0, 2000))))
    return out


def build(url: str, persons: int, seed: int, first_id: int = 1, **connect) -> dict[str, int]:
    """Create the four tables at ``url`` and fill them; returns the number of rows of each."""
    import psycopg

    data = synthesize(persons, seed, first_id)
    with psycopg.connect(url, autocommit=True, **connect) as conn:
        for table, cols in TABLES.items():
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} ({cols})")
            with conn.cursor().copy(f"COPY {table} FROM STDIN") as cp:
                for row in data[table]:
                    cp.write_row(row)
    return {t: len(rows) for t, rows in data.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True, help="libpq URI of the database (no password in it)")
    p.add_argument("--persons", type=int, default=2000, help="number of persons (default: 2000)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the synthetic records (default: 1)")
    p.add_argument("--first-id", type=int, default=1, help="person_id of the first person (default: 1); give "
                                                           "each hospital of a test federation its own range")
    a = p.parse_args()
    counts = build(a.db, a.persons, a.seed, a.first_id)
    print(", ".join(f"{t}: {n} rows" for t, n in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
