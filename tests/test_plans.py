"""Generic plans read for the sequential scans an index would serve (the statements
collector keeps EXPLAIN (FORMAT JSON) of the busiest statements on embedded clusters)."""

from __future__ import annotations

from pgscope.analyze.statements import SeqFilter, seq_filters

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
