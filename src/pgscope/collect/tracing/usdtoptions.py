"""Which USDT programs a trace runs: the usdt collector's options.

Choosing costs nothing by itself; what each chosen program costs is in its `bpf/*.bt` header
and docs/collector-usdt.md (io and lwlock_hold are the expensive ones, hence opt-in).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ProgramName = Literal["lwlock", "locks", "checkpoint", "io"]
DEFAULT_PROGRAMS: list[ProgramName] = ["lwlock", "locks", "checkpoint"]


class UsdtOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    programs: list[ProgramName] = Field(
        default_factory=lambda: list(DEFAULT_PROGRAMS),
        min_length=1,
        description="which bpftrace programs to run (io costs tens of uprobe traps per "
        "transaction: on request only)",
    )
    lwlock_hold: bool = Field(
        False,
        description="also time LWLock holds (two traps per acquisition: diagnostic "
        "traces only, it costs more throughput than it measures)",
    )

    def program_names(self) -> list[str]:
        names: list[str] = list(dict.fromkeys(self.programs))
        if self.lwlock_hold:
            names.append("lwlock_hold")
        return names
