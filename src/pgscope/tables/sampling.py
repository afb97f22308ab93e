"""What sessions were doing, sampled: the activity collector (and pg_wait_sampling's history,
for comparison)."""

from pgscope.tables import table

TABLES = (
    table(
        "activity_samples",
        "activity",
        "ts_us BIGINT NOT NULL",
        "sample_no BIGINT NOT NULL",
        "pid INTEGER",
        "backend_type VARCHAR",
        "state VARCHAR",
        "wait_event_type VARCHAR",
        "wait_event VARCHAR",
        "query_id BIGINT",
        "datname VARCHAR",
        "usename VARCHAR",
        "application_name VARCHAR",
    ),
    table(
        "activity_blockers",
        "activity",
        "ts_us BIGINT NOT NULL",
        "pid INTEGER NOT NULL",
        "blocked_by INTEGER NOT NULL",
    ),
    table(
        "activity_queries",
        "activity",
        "query_id BIGINT PRIMARY KEY",
        "query VARCHAR",
        "first_seen_us BIGINT",
    ),
    table(
        "activity_rate",
        "activity",
        "second_us BIGINT NOT NULL",
        "target_hz DOUBLE",
        "samples INTEGER",
        "lag_mean_ms DOUBLE",
        "lag_max_ms DOUBLE",
        "query_mean_ms DOUBLE",
        "query_max_ms DOUBLE",
    ),
    table(
        "pgws_history",
        "pgws",
        "ts_us BIGINT NOT NULL",
        "pid INTEGER",
        "event_type VARCHAR",
        "event VARCHAR",
        "query_id BIGINT",
    ),
)
