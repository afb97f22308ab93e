"""What a run folder keeps so that it can be run again (`pgscope run --again RUN`): the spec as
the run ran it, the files that spec names, and the versions it ran with.

`spec.toml` is the effective spec: the recipe or spec file after `--quick` and every flag,
with the client counts resolved on this host, the step order's seed, and the scripts and init
SQL pointing at copies in `inputs/` (relative to the folder: the folder can move). Loading it
as a spec file gives the same steps: variants, client counts, durations, repeats, order.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import tomli_w

from pgscope import __version__
from pgscope.errors import EnvironmentProblem
from pgscope.files import copy_new, write_atomic
from pgscope.spec import INPUTS_DIR, LoadedSpec

SPEC_FILE = "spec.toml"
VERSIONS_FILE = "versions.json"


def keep_spec(run_dir: Path, loaded: LoadedSpec, cores: int, seed: int, command: str) -> Path:
    """Write `spec.toml` and copy the spec's scripts and init SQL into `inputs/`."""
    spec = loaded.spec
    names: set[str] = set()

    def kept(path: Path) -> str:
        name = _free_name(path.name, names)
        try:
            (run_dir / INPUTS_DIR).mkdir(exist_ok=True)
            # Never more readable than the original: a script only its owner may read does
            # not become everyone's in the run folder.
            copy_new(path, run_dir / INPUTS_DIR / name)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot keep a copy of {path} in {run_dir / INPUTS_DIR}: {exc.strerror or exc}"
            ) from None
        return f"{INPUTS_DIR}/{name}"

    document: dict[str, Any] = spec.model_dump(mode="json", exclude_none=True)
    # Its variants are already among `variants`: a second expansion on another host could
    # pin to other CPU counts.
    document.pop("cpu_sweep", None)
    document["clients"] = spec.client_counts(cores)
    document["seed"] = seed
    document["scripts"] = [f"{kept(s.path)}@{s.weight}" for s in loaded.scripts()]
    if not document["scripts"]:
        del document["scripts"]
    init_sql = loaded.init_sql_path()
    if init_sql is not None:
        document["init_sql"] = kept(init_sql)
    header = (
        f"# The spec of run {run_dir.name} as pgscope {__version__} ran it: {loaded.source}\n"
        f"# with the flags of: {' '.join(command.split())}\n"
        f"# Client counts and the seed are resolved; scripts and init SQL are copies in "
        f"{INPUTS_DIR}/.\n"
        f"# Run it again: pgscope run --again {run_dir}\n\n"
    )
    path = run_dir / SPEC_FILE
    write_atomic(path, header + tomli_w.dumps(document))
    return path


def _free_name(name: str, taken: set[str]) -> str:
    """`name`, or `2-name`, `3-name` ... when two kept files share one (a.sql from two
    folders)."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{n}-{name}"
    taken.add(candidate)
    return candidate


def keep_versions(
    run_dir: Path, server: str | None, server_num: int | None, pgbench: str | None
) -> Path:
    """`versions.json`: pgscope's, the server's (None: it never answered) and pgbench's."""
    path = run_dir / VERSIONS_FILE
    document = {
        "pgscope": __version__,
        "python": platform.python_version(),
        "server": server,
        "server_version_num": server_num,
        "pgbench": pgbench,
    }
    write_atomic(path, json.dumps(document, indent=2) + "\n")
    return path
