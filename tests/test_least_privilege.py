"""User-provided files never run as root: pgbench scripts (`\\shell`) and init SQL (`\\!`)
run as the unprivileged account, which reads copies of files it could not reach itself."""

from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path

import pytest

from tests.cli import pgscope
from tests.runs import run_doc

pytestmark = [pytest.mark.server, pytest.mark.load]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root could run scripts as another user")
def test_scripts_and_init_sql_run_as_the_unprivileged_account(tmp_path: Path) -> None:
    # Where the account may write what it ran as (the session's TMPDIR, like its clusters).
    drop = Path(tempfile.mkdtemp(prefix="uid-drop-"))
    drop.chmod(0o1777)
    # The spec sits in a folder only root may enter: the account reads pgscope's copies.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "whoami.sql").write_text(f"\\shell id -u > {drop}/script-uid\nSELECT 1;\n")
    (private / "schema.sql").write_text(f"\\! id -u > {drop}/init-uid\ncreate table t(i int);\n")
    (private / "spec.toml").write_text(
        'name = "whoami"\nscripts = ["whoami.sql"]\ninit_sql = "schema.sql"\nscale = 0\n'
        "clients = [1]\nduration = 1\nwarmup = 0\nrepeats = 1\n"
    )
    before = set(Path(tempfile.gettempdir()).glob("pgscope-load-*"))
    result = pgscope(
        "run",
        str(private / "spec.toml"),
        "--collectors",
        "activity",
        "--results-dir",
        str(tmp_path / "results"),
        "--json",
    )
    run_doc(result)
    postgres = pwd.getpwnam("postgres").pw_uid
    assert postgres != 0
    assert (drop / "script-uid").read_text().strip() == str(postgres)
    assert (drop / "init-uid").read_text().strip() == str(postgres)
    leftover = set(Path(tempfile.gettempdir()).glob("pgscope-load-*")) - before
    assert not leftover, f"the account's working directory is removed: {leftover}"
