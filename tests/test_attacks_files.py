"""Issue 27, second round: the file-system and received-folder attacks a red team ran on
pgscope as root, each run again here the way it was run, and shown to do no harm. Harm is: a
file of root's changed (its bytes, owner or mode: each attack aims at root-owned 0600 files in
a folder only root may enter), a secret's bytes copied anywhere pgscope writes or shown on its
output, a planted link followed, a program someone planted run.

A received folder is a copy of a real small run (one step of 1 s, built once for the module)
with things planted in it, as a colleague's folder sent for a second opinion would be.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
import tomli_w

import pgscope as pgscope_package
from pgscope.errors import ExitCode
from pgscope.target.embedded import EmbeddedCluster
from tests.cli import one_line_error, pgscope
from tests.runs import run_doc

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks are on what pgscope does as root"
)

# Where the pgscope under test lives (the CLI children run that one too).
SRC = Path(pgscope_package.__file__).parent.parent


@dataclass(frozen=True)
class RootFile:
    """A file of root's, 0600, in a folder only root may enter: what an attack aims at."""

    path: Path
    content: bytes

    def untouched(self) -> None:
        found = os.lstat(self.path)
        assert stat.S_ISREG(found.st_mode), f"{self.path} was replaced"
        assert (found.st_uid, found.st_gid) == (0, 0), f"{self.path} changed hands"
        assert stat.S_IMODE(found.st_mode) == 0o600, f"{self.path}: {oct(found.st_mode)}"
        assert self.path.read_bytes() == self.content, f"{self.path} was written"


@pytest.fixture
def vault(tmp_path: Path) -> Callable[[str, bytes], RootFile]:
    """Makes root's files in a folder of tmp_path that only root may enter."""
    folder = tmp_path / "vault"
    folder.mkdir(mode=0o700)

    def make(name: str, content: bytes) -> RootFile:
        path = folder / name
        path.write_bytes(content)
        path.chmod(0o600)
        return RootFile(path, content)

    return make


def nowhere(secret: bytes, *places: Path, outputs: tuple[str, ...] = ()) -> None:
    """`secret` in no file under `places` (links are not followed: a planted one is not a
    copy) and on none of `outputs`."""
    for text in outputs:
        assert secret.decode() not in text, "the secret is on pgscope's output"
    for place in places:
        for folder, _dirs, files in os.walk(place):
            for name in files:
                path = Path(folder, name)
                if path.is_symlink() or not path.is_file():
                    continue
                assert secret not in path.read_bytes(), f"the secret is in {path}"


def tree(place: Path) -> set[str]:
    return {str(p.relative_to(place)) for p in place.rglob("*")}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run folder: a one-line script, 1 client, one step of 1 s, no collectors."""
    inputs = tmp_path_factory.mktemp("inputs")
    inputs.chmod(0o755)
    script = inputs / "plain.sql"
    script.write_text("SELECT 1;\n")
    script.chmod(0o644)
    results = tmp_path_factory.mktemp("small-run")
    result = pgscope(
        *("run", "--script", str(script), "--scale", "0", "--clients", "1"),
        *("--repeats", "1", "--duration", "1", "--warmup", "0", "--no-collectors"),
        *("--results-dir", str(results), "--json"),
    )
    return Path(run_doc(result)["run_dir"])


@pytest.fixture
def received(small_run: Path, tmp_path: Path) -> Path:
    """A copy of the small run, as someone else's folder arrives: for them to plant in."""
    folder = tmp_path / "received" / small_run.name
    shutil.copytree(small_run, folder, symlinks=True)
    return folder


# A pgscope whose PID is known before it starts: the red team planted links at the names
# pgscope's temporary files take from it.
KNOWN_PID = """
import os, runpy, sys
print(os.getpid(), flush=True)
sys.stdin.readline()
sys.argv = ["pgscope", *sys.argv[1:]]
runpy.run_module("pgscope", run_name="__main__", alter_sys=True)
"""


def pgscope_planted(
    args: list[str], plant: Callable[[int], None]
) -> subprocess.CompletedProcess[str]:
    """`pgscope ARGS` in a process that says its PID first, and starts once `plant(pid)` has
    planted what it wants."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KNOWN_PID, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    try:
        plant(pid)
    finally:
        out, err = proc.communicate("go\n", timeout=300)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


# -- 1. a pgbench script gets root's files --------------------------------------------------

# As the load account, in the step's folder, where pgbench writes its logs; pgscope's copy of
# the script is two folders up, in files/N/. Between two steps it swaps that copy for a link
# to a root file (pgscope re-copied the scripts before each step, through the link, then
# chowned the file to the account), and plants a link among its transaction logs (pgscope
# read them back and archived them into the run folder). It logs what it managed.
ATTACK = """#!/bin/sh
[ -e .done ] && exit 0
touch .done
for copy in ../../files/*/attack.sql; do
    if rm -f "$copy" 2>/dev/null && ln -s {target} "$copy"; then
        echo swapped >> {drop}/log
    else
        echo refused >> {drop}/log
    fi
done
ln -s {log_secret} xact.999999 && echo planted >> {drop}/log
exit 0
"""


@pytest.mark.server
def test_a_script_cannot_swap_its_copy_for_a_link_between_steps(
    tmp_path: Path, vault: Callable[[str, bytes], RootFile]
) -> None:
    target = vault("target", b"root's own file\n")
    # A line as pgbench logs a transaction: client 987654321 would show in the archive.
    log_secret = vault("log-secret", b"987654321 0 1000 0 1700000000 0\n")
    drop = Path(tempfile.mkdtemp(prefix="attack-", dir=tempfile.gettempdir()))
    try:
        drop.chmod(0o1777)  # the account runs attack.sh from here and logs into it
        attack = drop / "attack.sh"
        attack.write_text(ATTACK.format(target=target.path, log_secret=log_secret.path, drop=drop))
        attack.chmod(0o755)
        script = drop / "attack.sql"
        script.write_text(f"\\shell {attack}\nSELECT 1;\n")
        script.chmod(0o644)
        spec = tmp_path / "spec.toml"
        spec.write_text(
            f'name = "swap"\nscripts = ["{script}"]\nscale = 0\nclients = [1]\n'
            "duration = 1\nwarmup = 0\nrepeats = 2\ncollectors = {}\n"
        )
        results = tmp_path / "results"
        result = pgscope("run", str(spec), "--results-dir", str(results), "--json")
        log = (drop / "log").read_text().split()
    finally:
        shutil.rmtree(drop, ignore_errors=True)
    target.untouched()
    log_secret.untouched()
    assert "planted" in log and "refused" in log, f"the attack ran: {log}"
    assert "swapped" not in log, log
    doc = run_doc(result)
    assert len(doc["steps"]) == 2
    run_dir = Path(doc["run_dir"])
    for archive in run_dir.glob("steps/*/xact.parquet"):
        with contextlib.closing(duckdb.connect()) as db:
            rows = db.execute(
                f"SELECT count(*) FROM '{archive}' WHERE client_id = 987654321"
            ).fetchone()
        assert rows == (0,), f"{archive} holds the planted log's line"
    assert len(list(run_dir.glob("steps/*/xact.parquet"))) == 2
    nowhere(b"987654321", run_dir, outputs=(result.stdout, result.stderr))


# -- 2. export of a received folder ----------------------------------------------------------


@pytest.mark.server
def test_export_names_its_files_from_its_own_list_never_from_the_store(
    received: Path, tmp_path: Path, vault: Callable[[str, bytes], RootFile]
) -> None:
    """Table names with a quote (SQL into COPY ... TO) and with a path (../..)."""
    target = vault("target", b"root's own file\n")
    injected = f"run\" TO '{target.path}' (FORMAT csv); COPY \"run"
    with contextlib.closing(duckdb.connect(str(received / "run.duckdb"))) as db:
        for name in (injected, "../../escaped"):
            quoted = '"' + name.replace('"', '""') + '"'
            db.execute(f"CREATE TABLE {quoted} AS SELECT 'planted' AS what")
    out = tmp_path / "a" / "b" / "out"
    result = pgscope("export", str(received), "--out", str(out), "--json")
    target.untouched()
    assert result.returncode == 0, result.stderr
    assert tree(tmp_path / "a") == {"b", "b/out", *(f"b/out/{p}" for p in tree(out))}
    written = {Path(f["path"]).name for f in json.loads(result.stdout)["files"]}
    assert "run.csv" in written and "steps.csv" in written
    assert tree(out) == written, "only the store's own tables, by their own names"


@pytest.mark.server
def test_export_refuses_an_export_folder_planted_as_a_link(
    received: Path, vault: Callable[[str, bytes], RootFile]
) -> None:
    target = vault("steps.csv", b"root's own file\n")
    (received / "export").symlink_to(target.path.parent)
    result = pgscope("export", str(received))
    target.untouched()
    assert result.returncode == ExitCode.SPEC, result.stderr
    assert "symbolic link" in one_line_error(result)
    assert sorted(p.name for p in target.path.parent.iterdir()) == ["steps.csv"]


@pytest.mark.server
def test_export_writes_nothing_through_links_planted_in_the_export_folder(
    received: Path, vault: Callable[[str, bytes], RootFile]
) -> None:
    """Links at the files' names, and at the temporary names the files took from the PID.
    (DuckDB 2.0's COPY happened to remove a file before writing it, so this attack failed on
    the old code too; it stays so because pgscope no longer writes there by name.)"""
    folder = received / "export"
    folder.mkdir()
    targets = []

    def plant(pid: int) -> None:
        for name in ("run.csv", f".run.csv.{pid}.tmp", "steps.csv", f".steps.csv.{pid}.tmp"):
            targets.append(vault(name.strip("."), b"root's own file\n"))
            (folder / name).symlink_to(targets[-1].path)

    result = pgscope_planted(["export", str(received)], plant)
    for target in targets:
        target.untouched()
    assert result.returncode == 0, result.stderr
    assert (folder / "run.csv").is_file() and not (folder / "run.csv").is_symlink()


# -- 3. report files follow planted links ----------------------------------------------------


@pytest.mark.server
def test_report_files_never_follow_links_planted_at_their_names(
    received: Path, vault: Callable[[str, bytes], RootFile]
) -> None:
    """`report --format html` rewrites summary.json, summary.txt and report.html in the
    folder: links planted at those names and at their temporary names."""
    targets = []

    def plant(pid: int) -> None:
        for name in ("summary.json", "summary.txt", "report.html"):
            for planted in (name, f".{name}.{pid}.tmp"):
                (received / planted).unlink(missing_ok=True)
                targets.append(vault(planted.strip("."), b"root's own file\n"))
                (received / planted).symlink_to(targets[-1].path)

    result = pgscope_planted(["report", str(received), "--format", "html"], plant)
    for target in targets:
        target.untouched()
    assert result.returncode == 0, result.stderr
    for name in ("summary.json", "summary.txt", "report.html"):
        assert (received / name).is_file() and not (received / name).is_symlink()


# -- 4. a store's views and macros are trusted ----------------------------------------------

PLANTS = {
    # `run` a view over root's files: `runs` printed them, `report` wrote them into reports.
    "view": (
        "CREATE TABLE run_kept AS SELECT * FROM run; DROP TABLE run; "
        "CREATE VIEW run AS SELECT r.* EXCLUDE (recipe, status_reason), s.content AS recipe, "
        "e.content AS status_reason FROM run_kept r, read_text('{secret}') s, "
        "read_text('/proc/self/environ') e"
    ),
    # A macro in the store's schema shadows DuckDB's own function of that name.
    "macro": "CREATE MACRO avg(x) AS (SELECT content FROM read_text('{secret}'))",
}


@pytest.mark.server
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_store_runs_no_sql_that_reads_roots_files(
    plant: str, received: Path, tmp_path: Path, vault: Callable[[str, bytes], RootFile]
) -> None:
    secret = vault("secret", b"vault-secret-5c2e9a")
    with contextlib.closing(duckdb.connect(str(received / "run.duckdb"))) as db:
        db.execute(PLANTS[plant].format(secret=secret.path))
    environ = "environ-secret-77d1b0"
    env = {"PGSCOPE_ATTACK_MARK": environ}
    out = tmp_path / "out"
    results = [
        pgscope("runs", "--results-dir", str(received.parent), env=env),
        pgscope("runs", "--results-dir", str(received.parent), "--json", env=env),
        pgscope("report", str(received), env=env),
        pgscope("report", str(received), "--format", "html", env=env),
        pgscope("export", str(received), "--out", str(out), env=env),
    ]
    listed = json.loads(results[1].stdout)
    assert [r["status"] for r in listed] == ["unreadable"]
    for result in results[2:]:
        assert result.returncode == ExitCode.SPEC, result.stderr
        assert "not a pgscope run store" in one_line_error(result)
    outputs = tuple(text for r in results for text in (r.stdout, r.stderr))
    nowhere(secret.content, received, tmp_path / "out", outputs=outputs)
    nowhere(environ.encode(), received, tmp_path / "out", outputs=outputs)
    secret.untouched()


# -- 5. run --again of a received folder ----------------------------------------------------


def _edit_spec(folder: Path, edit: Callable[[dict[str, object]], None]) -> None:
    path = folder / "spec.toml"
    document = tomllib.loads(path.read_text())
    edit(document)
    path.write_text(tomli_w.dumps(document))


@pytest.mark.server
@pytest.mark.parametrize("where", ["outside", "up-and-out", "linked", "init-sql"], ids=lambda w: w)
def test_run_again_reads_only_the_folders_own_inputs(
    where: str, received: Path, tmp_path: Path, vault: Callable[[str, bytes], RootFile]
) -> None:
    secret = vault("secret.sql", b"SELECT 'vault-secret-91ad40';\n")
    named = {
        "outside": str(secret.path),
        "up-and-out": f"inputs/../../../{secret.path.relative_to(tmp_path)}",
        "linked": "inputs/linked.sql",
        "init-sql": str(secret.path),
    }[where]
    if where == "linked":
        (received / "inputs" / "linked.sql").symlink_to(secret.path)

    def edit(spec: dict[str, object]) -> None:
        if where == "init-sql":
            spec["init_sql"] = named
        else:
            spec["scripts"] = [f"{named}@1"]

    _edit_spec(received, edit)
    results = tmp_path / "results"
    result = pgscope("run", "--again", str(received), "--results-dir", str(results))
    secret.untouched()
    nowhere(secret.content, tmp_path / "received", results, outputs=(result.stdout, result.stderr))
    assert result.returncode == ExitCode.SPEC, result.stderr[-2000:]
    line = one_line_error(result)
    assert named in line and "inputs" in line, line
    assert not results.exists() or not any(results.iterdir()), "no run was started"


def dsn(cluster: EmbeddedCluster) -> str:
    """A read-only role's DSN (a user's script runs on --dsn only as a role that cannot
    write: tests/test_attacks_readonly.py)."""
    with cluster.connect() as session:
        if not session.execute("SELECT 1 FROM pg_roles WHERE rolname = 'reader'").fetchone():
            session.execute("CREATE ROLE reader LOGIN")
            session.execute("GRANT pg_monitor TO reader")
    return f"host={cluster.socket_dir} port={cluster.port} user=reader dbname=postgres"


@pytest.mark.server
def test_run_again_on_a_users_server_runs_no_kernel_tracing_its_folder_names(
    received: Path, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """A folder's spec.toml naming usdt and perf: on a --dsn server they run only when the
    user names them on the command line."""
    _edit_spec(received, lambda spec: spec.update(collectors={"usdt": {}, "perf": {}}))
    again = ["run", "--again", str(received), "--dsn", dsn(cluster)]
    plan = pgscope(*again, "--plan", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["collectors"] == []
    own = pgscope(*again, "--collectors", "usdt", "--plan", "--json")
    assert json.loads(own.stdout)["collectors"] == ["usdt"], "the user's own flag stands"
    result = pgscope(*again, "--results-dir", str(tmp_path / "results"), "--json")
    doc = run_doc(result)
    dropped = [line for line in result.stderr.splitlines() if "spec.toml, not by you" in line]
    assert len(dropped) == 2, result.stderr
    ran = {c["name"] for c in doc["environment"]["collectors"]}
    assert not ran & {"usdt", "perf"}, ran


# -- 6. a planted sampler binary runs as root ------------------------------------------------


@pytest.mark.server
def test_a_sampler_planted_in_the_cache_folder_is_never_run(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    """Where pgscope used to build and cache the memory sampler, by its source's hash."""
    source = SRC / "pgscope" / "collect" / "native" / "shmem_sampler.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    cache = tmp_path / "cache"
    planted = cache / "pgscope" / f"pgscope-shmem-sampler-{digest}"
    planted.parent.mkdir(parents=True)
    ran = tmp_path / "planted-ran"
    planted.write_text(f"#!/bin/sh\ntouch {ran}\n")
    planted.chmod(0o755)
    # Finding the arrays can miss its moment on a busy host (our own session's pg_sleep is
    # not seen in time): the sampler is only looked for after it, so that is tried again.
    for attempt in range(3):
        results = tmp_path / f"results-{attempt}"
        result = pgscope(
            *("observe", "--data-dir", str(cluster.data_dir), "--duration", "2"),
            *("--window", "1", "--sampler", "memory", "--results-dir", str(results)),
            env={"XDG_CACHE_HOME": str(cache)},
        )
        assert not ran.exists(), "the planted program ran"
        if "could not tell the wait and state fields apart" not in result.stderr:
            break
    assert result.returncode == 0, result.stderr[-2000:]
    [run_dir] = results.iterdir()
    with contextlib.closing(duckdb.connect(str(run_dir / "run.duckdb"), read_only=True)) as db:
        events = [e for (e,) in db.execute("SELECT detail FROM events").fetchall()]
    assert any(e.startswith("sampling from the server's shared memory") for e in events), events


# -- what a killed run left, and what someone else made look so ------------------------------


def test_only_folders_pgscope_marked_itself_are_leftovers(tmp_path: Path) -> None:
    """The next run stops the servers of a killed run's folders and deletes them. $TMPDIR is
    everyone's: a folder marked by another account, a link to a marked folder, or a marker
    that is a FIFO (which blocked the reader) is not pgscope's."""
    from pgscope import leftovers
    from pgscope.proc import server_account

    gone = "999999999 0\n"  # a PID no process has
    work = tmp_path / "work"
    work.mkdir()
    ours = work / "pgscope-ours"
    ours.mkdir()
    (ours / leftovers.MARKER).write_text(gone)
    theirs = work / "pgscope-theirs"
    theirs.mkdir()
    (theirs / leftovers.MARKER).write_text(gone)
    account = server_account(None)
    os.chown(theirs / leftovers.MARKER, account.uid, account.gid)
    fifo = work / "pgscope-fifo"
    fifo.mkdir()
    os.mkfifo(fifo / leftovers.MARKER)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / leftovers.MARKER).write_text(gone)
    (work / "pgscope-link").symlink_to(elsewhere)
    assert [found.path for found in leftovers.find([work])] == [ours]
