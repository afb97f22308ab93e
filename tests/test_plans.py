"""Generic plans read for the sequential scans an index would serve (the statements
collector keeps EXPLAIN (FORMAT JSON) of the busiest statements on embedded clusters)."""

from __future__ import annotations

from pgscope.analyze.statements import SeqFilter, seq_filters
from pgscope.target.embedded import EmbeddedCluster

# As PostgreSQL 15 prints them (keys it adds and the fields we do not read trimmed).
LOOKUP = [
    {
        "Plan": {
            "Node Type": "Seq Scan",
            "Relation Name": "items",
            "Alias": "items",
            "Filter": "(customer = $1)",
        }
    }
]
NESTED = [
    {
        "Plan": {
            "Node Type": "Aggregate",
            "Plans": [
                {
                    "Node Type": "Hash Join",
                    "Plans": [
                        {
                            "Node Type": "Seq Scan",
                            "Relation Name": "orders",
                            "Filter": "(((code)::text = $1) AND (o.placed > $2))",
                        },
                        {
                            "Node Type": "Hash",
                            "Plans": [{"Node Type": "Seq Scan", "Relation Name": "regions"}],
                        },
                    ],
                }
            ],
        }
    }
]
BY_INDEX = [
    {
        "Plan": {
            "Node Type": "Index Scan",
            "Relation Name": "pgbench_accounts",
            "Index Cond": "(aid = $1)",
        }
    }
]


def test_a_filtering_sequential_scan_names_its_table_and_columns() -> None:
    assert seq_filters(LOOKUP) == [SeqFilter("items", "(customer = $1)", ["customer"])]
    [scan] = seq_filters(NESTED)
    assert scan.relation == "orders" and scan.columns == ["code", "placed"], scan


def test_scans_that_filter_nothing_or_use_an_index_are_not_named() -> None:
    assert seq_filters(BY_INDEX) == []
    assert seq_filters([{"Plan": {"Node Type": "Seq Scan", "Relation Name": "t"}}]) == []
    assert seq_filters(None) == [] and seq_filters([{"no plan": 1}]) == []


# Issue 30: a statement whose normalised text holds `interval $2` never had its plan stored
# ("syntax error at or near $2"): pg_stat_statements turns a typed literal's constant into a
# parameter, which PREPARE does not take after a type name.
TYPED = [
    (
        "SELECT * FROM t WHERE ts > now() - interval $2 AND a = $1",
        "SELECT * FROM t WHERE ts > now() - CAST($2 AS interval) AND a = $1",
    ),
    (
        "SELECT interval $1 day, date $2, timestamp with time zone $3, x::interval",
        "SELECT CAST($1 AS interval day), CAST($2 AS date), "
        "CAST($3 AS timestamp with time zone), x::interval",
    ),
    # Quoted text, identifiers and dollar quotes are not SQL to rewrite.
    (
        "SELECT 'interval $1', \"interval $1\", $q$ date $1 $q$ FROM t WHERE c = $1",
        "SELECT 'interval $1', \"interval $1\", $q$ date $1 $q$ FROM t WHERE c = $1",
    ),
    ("SELECT * FROM t WHERE x = $1 LIMIT $2", "SELECT * FROM t WHERE x = $1 LIMIT $2"),
]


def test_a_typed_literals_parameter_is_prepared_as_the_cast_it_stands_for() -> None:
    from pgscope.collect.statistics.statements import preparable

    for text, expected in TYPED:
        assert preparable(text) == expected


def test_the_generic_plan_of_a_statement_with_an_interval_parameter_is_kept(
    shared_cluster: EmbeddedCluster,
) -> None:
    """On a real server, as the collector plans it (PREPARE, EXPLAIN EXECUTE with NULLs):
    the normalised text pg_stat_statements gives a query with `interval '1 day'`."""
    from pgscope.collect.statistics.statements import _generic_plan

    text = "SELECT relname FROM pg_class WHERE now() - interval $2 > now() AND oid = $1"
    with shared_cluster.conn.connect() as session:
        session.execute("SET plan_cache_mode = force_generic_plan")
        plan, error = _generic_plan(session, text)
    assert error is None, error
    assert plan is not None and '"Node Type"' in plan
