-- One row per person: the features of examples/omop/schema.toml, flattened from the OMOP tables.
-- person_id is the record id (the schema's id_column): the site's privacy ledger charges the same person
-- in every session, whatever else the query selects.
WITH conditions AS (
    SELECT person_id,
           bool_or(condition_concept_id = 201826)  AS diabetes,
           bool_or(condition_concept_id = 316866)  AS hypertension,
           bool_or(condition_concept_id = 4329847) AS infarction
    FROM condition_occurrence GROUP BY person_id
), visits AS (
    SELECT person_id,
           count(*)                                  AS visits,
           count(*) FILTER (WHERE visit_concept_id = 9203) AS er_visits
    FROM visit_occurrence GROUP BY person_id
), measures AS (
    SELECT person_id,
           avg(value_as_number) FILTER (WHERE measurement_concept_id = 3038553) AS bmi,
           max(value_as_number) FILTER (WHERE measurement_concept_id = 3004249) AS max_systolic_bp
    FROM measurement GROUP BY person_id
)
SELECT p.person_id,
       2020 - p.year_of_birth                                   AS age,
       CASE p.gender_concept_id WHEN 8507 THEN 'M' WHEN 8532 THEN 'F' ELSE 'other' END AS sex,
       CASE WHEN c.diabetes THEN 'yes' ELSE 'no' END            AS diabetes,
       CASE WHEN c.hypertension THEN 'yes' ELSE 'no' END        AS hypertension,
       coalesce(v.visits, 0)                                    AS visits,
       coalesce(v.er_visits, 0)                                 AS er_visits,
       m.bmi,                                                   -- NULL: never measured (allow_missing)
       m.max_systolic_bp,
       CASE WHEN c.infarction THEN 1 ELSE 0 END                 AS infarction
FROM person p
LEFT JOIN conditions c ON c.person_id = p.person_id
LEFT JOIN visits v     ON v.person_id = p.person_id
LEFT JOIN measures m   ON m.person_id = p.person_id
ORDER BY p.person_id
