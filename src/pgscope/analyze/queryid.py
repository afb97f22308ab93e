"""A PostgreSQL query id as the analysis holds it and as JSON carries it.

Query ids use all 64 bits; JSON readers such as jq and JavaScript hold numbers as doubles,
exact only up to 2^53, so a number would come out rounded and name another statement. Every
JSON document pgscope writes carries them as decimal strings; reading one back gives the int.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer


def _from_json(value: object) -> object:
    return int(value) if isinstance(value, str) else value


def as_json(query_id: int | None) -> str | None:
    """For documents built by hand (not through the model's adapter)."""
    return None if query_id is None else str(query_id)


QueryId = Annotated[
    int,
    BeforeValidator(_from_json),
    PlainSerializer(as_json, return_type=str, when_used="json"),
]
