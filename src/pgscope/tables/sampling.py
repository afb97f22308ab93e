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
        # What a client session running without a query id ran (its statement's text, its
        # first 200 characters: a COMMIT, a utility statement, a statement sent with the
        # extended protocol, which PostgreSQL 15-17 gives no id while it executes); NULL
        # otherwise, and from the shared-memory source, which reads no text.
        "command VARCHAR @9",
        series="ts_us",
    ),
    table(
        "activity_blockers",
        "activity",
        "ts_us BIGINT NOT NULL",
        "pid INTEGER NOT NULL",
        "blocked_by INTEGER NOT NULL",
        "locktype VARCHAR @6",
        "relation VARCHAR @6",
        "mode VARCHAR @6",
        "blocker_state VARCHAR @6",
        "blocker_xact_s DOUBLE @6",
        "blocker_state_s DOUBLE @6",
        "blocker_query_id BIGINT @6",
        "blocker_query VARCHAR @6",
        "blocker_application VARCHAR @6",
        series="ts_us",
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
        series="second_us",
    ),
    table(
        "pgws_history",
        "pgws",
        "ts_us BIGINT NOT NULL",
        "pid INTEGER",
        "event_type VARCHAR",
        "event VARCHAR",
        "query_id BIGINT",
        series="ts_us",
    ),
)
