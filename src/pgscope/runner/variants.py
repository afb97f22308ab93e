"""What a variant asks of the runner: server settings, pinned CPUs, pgbench variables and
side-by-side instances, all read from `Spec.variant`."""

from __future__ import annotations

from pgscope.spec import DEFINE_PREFIX, Spec, setting_text


def effective_settings(spec: Spec, variant: str) -> dict[str, str]:
    """The server settings of a variant (its own over the spec's), without pgscope's keys."""
    return {
        name: setting_text(value)
        for name, value in spec.variant(variant).items()
        if not name.startswith("pgscope.")
    }


def variant_cpus(spec: Spec, variant: str) -> int | None:
    """How many CPUs the variant pins the server to (`pgscope.cpus`), if any."""
    value = spec.variant(variant).get("pgscope.cpus")
    return int(value) if value is not None else None


def variant_defines(spec: Spec, variant: str) -> tuple[tuple[str, str], ...]:
    """pgbench variables of a variant (`pgscope.define.NAME`), as -D pairs."""
    return tuple(
        (key[len(DEFINE_PREFIX) :], setting_text(value))
        for key, value in sorted(spec.variant(variant).items())
        if key.startswith(DEFINE_PREFIX)
    )


def variant_instances(spec: Spec, variant: str) -> int:
    """How many clusters side by side the variant runs (`pgscope.instances`), 1 by default."""
    return int(spec.variant(variant).get("pgscope.instances", 1))


def cpu_split(pinned: int | None, available: list[int]) -> tuple[set[int] | None, set[int] | None]:
    """(server CPUs, pgbench CPUs): the server on the first `pinned`, pgbench on the rest
    where any remain (else wherever the scheduler puts it); None means unpinned."""
    if pinned is None:
        return None, None
    server = set(available[:pinned])
    rest = set(available[pinned:])
    return server, rest or None
