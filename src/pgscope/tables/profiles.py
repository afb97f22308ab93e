"""What the CPU profilers recorded: perf (on CPU) and offcpu (where processes sleep), as folded
stacks per step."""

from pgscope.tables import table

TABLES = (
    table(
        "profiles",
        "profiles",
        "step_id INTEGER",
        "kind VARCHAR NOT NULL",
        "started_us BIGINT",
        "ended_us BIGINT",
        "hz INTEGER",
        "total BIGINT",
        "stacks INTEGER",
        "processes INTEGER",
        "unknown_frames DOUBLE",
        "note VARCHAR",
    ),
    table(
        "profile_processes",
        "profiles",
        "step_id INTEGER",
        "kind VARCHAR NOT NULL",
        "pid INTEGER NOT NULL",
        "role VARCHAR NOT NULL",
        "value BIGINT NOT NULL",
    ),
    table(
        "profile_stacks",
        "profiles",
        "step_id INTEGER",
        "kind VARCHAR NOT NULL",
        "role VARCHAR NOT NULL",
        "state VARCHAR",
        "stack VARCHAR NOT NULL",
        "value BIGINT NOT NULL",
    ),
)
