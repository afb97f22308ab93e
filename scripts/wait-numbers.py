"""Writes src/pgscope/collect/sampling/wait_numbers.toml: per PostgreSQL major version, the names of the
wait events of each numbered class in the order of their numbers, and the LWLock names by
tranche id.

Why: the shared-memory sampler reads a process's wait as a number (wait_event_info: the class
in the top byte; below, the event's position in its class's enum, or for LWLocks the tranche
id). PostgreSQL 17 and later list their events in enum order (pg_get_wait_events()); 15 and 16
have no such list, and no version lists LWLocks by id. So they are taken from the version's
headers (utils/wait_event.h's enums, which have no #if; storage/lwlocknames.h's individual
locks; storage/lwlock.h's BuiltinTrancheIds, which follow them) and its binary: each enum
member matches exactly one of the binary's strings once underscores and case are set aside
(they are what the server reports).

    python3 scripts/wait-numbers.py 15=INCLUDE,POSTGRES 16=INCLUDE,POSTGRES \
        17=INCLUDE18,POSTGRES17,lwlocks-only,borrowed 18=INCLUDE,POSTGRES,lwlocks-only

INCLUDE is the server include directory: postgresql-server-dev-15 (`apt-get download`,
`dpkg -x`), the 16 and 18 wheels' pginstall/include. 17's wheel has none: 18's headers are
used with 17's binary, keeping the locks and tranches the binary names (18 added two). The
sampler uses an LWLock list on 17 and later only when its names are the server's
(pg_wait_events). tests/test_waitnames.py and tests/test_activity_memory.py check the lists
against the binaries and live servers.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src/pgscope/collect/sampling/wait_numbers.toml"
CLASSES = {
    "WaitEventActivity": "Activity",
    "WaitEventClient": "Client",
    "WaitEventIPC": "IPC",
    "WaitEventTimeout": "Timeout",
    "WaitEventIO": "IO",
}
# Members whose name is not their event's name with underscores removed. A tail of a longer
# string matches too (the linker stores LockManager inside PredicateLockManager), so a name
# that is the tail of another (LauncherDSA) must be spelt out here: pg_wait_events, on 17
# and later, is where such a mistake shows (tests/test_activity_memory.py).
SPELLED = {
    "MQ": "MESSAGEQUEUE",
    "WALSENDERWAITWAL": "WALSENDERWAITFORWAL",
    "LAUNCHER": "LOGICALREPLAUNCHER",
}


def enums(header: Path) -> dict[str, list[str]]:
    text = re.sub(r"/\*.*?\*/", "", header.read_text(), flags=re.S)
    found = {}
    for body, name in re.findall(r"typedef enum\s*\{(.*?)\}\s*(WaitEvent\w+);", text, re.S):
        members = [m.split("=")[0].strip() for m in body.split(",") if m.strip()]
        found[CLASSES[name]] = [m.removeprefix("WAIT_EVENT_") for m in members]
    return found


def strings(binary: Path) -> dict[str, set[str]]:
    """The binary's identifier-like strings by their upper case, and their tails: the linker
    merges a string into a longer one that ends with it (TimelineHistoryRead)."""
    out = subprocess.run(["strings", "-n", "4", str(binary)], capture_output=True, text=True)
    index: dict[str, set[str]] = {}
    for word in out.stdout.split("\n"):
        if re.fullmatch(r"[A-Za-z0-9]+", word):
            for start in range(len(word)):
                if word[start].isupper():
                    index.setdefault(word[start:].upper(), set()).add(word[start:])
    return index


def name(member: str, index: dict[str, set[str]], key: str | None = None) -> str:
    key = key or member.replace("_", "")
    for short, long in SPELLED.items():
        key = long + key[len(short) :] if key.startswith(short) else key
    # A GUC of the same letters (archiveCleanupCommand) is no event name: those start upper.
    candidates = sorted(index.get(key, set()))
    if len(candidates) != 1:
        raise SystemExit(f"wait-numbers: {member}: {candidates or 'no'} name(s)")
    return candidates[0]


def lwlocks(include: Path, index: dict[str, set[str]], strict: bool) -> list[str]:
    """LWLock names by tranche id ("" where none): the individual locks, then the builtin
    tranches from the first id after them. Not strict: those the binary lacks are left out."""
    defines = (include / "storage/lwlocknames.h").read_text()
    individual = {
        int(n): name.removesuffix("Lock")
        for name, n in re.findall(r"#define (\w+)\s+\(&MainLWLockArray\[(\d+)\]\.lock\)", defines)
    }
    if not strict:
        individual = {n: name for n, name in individual.items() if name.upper() in index}
    count = max(individual) + 1
    if strict:
        declared = int(re.findall(r"NUM_INDIVIDUAL_LWLOCKS\s+(\d+)", defines)[0])
        assert count == declared, (count, declared)
    text = re.sub(r"/\*.*?\*/", "", (include / "storage/lwlock.h").read_text(), flags=re.S)
    body = re.findall(r"typedef enum BuiltinTrancheIds\s*\{(.*?)\}", text, re.S)[0]
    members = [m.split("=")[0].strip() for m in body.split(",") if m.strip()]
    tranches = []
    for member in members:
        if member == "LWTRANCHE_FIRST_USER_DEFINED":
            break
        key = member.removeprefix("LWTRANCHE_").replace("_", "")
        if strict or key in index:
            tranches.append(name("LWTRANCHE_" + member.removeprefix("LWTRANCHE_"), index, key))
    return [individual.get(n, "") for n in range(count)] + tranches


def table(include: Path, binary: Path, flags: list[str]) -> dict[str, list[str]]:
    """flags: `lwlocks-only` (17 and later list the rest), `borrowed` (the headers are
    another version's: keep what the binary names)."""
    index = strings(binary)
    found = (
        {}
        if "lwlocks-only" in flags
        else {
            kind: [name(m, index) for m in members]
            for kind, members in enums(include / "utils/wait_event.h").items()
        }
    )
    found["LWLock"] = lwlocks(include, index, strict="borrowed" not in flags)
    return found


def main(args: list[str]) -> None:
    lines = [
        "# Generated by scripts/wait-numbers.py from each version's headers and server binary;",
        "# do not edit. Per major version and class, the events in the order of their numbers:",
        "# an event's wait_event_info is its class's byte << 24 | its position (for LWLock, its",
        '# tranche id; "" where none). 17 and later list their other classes themselves',
        "# (pg_get_wait_events()).",
    ]
    for arg in args:
        major, paths = arg.split("=")
        include, binary, *flags = paths.split(",")
        found = table(Path(include), Path(binary), flags)
        for kind, names in found.items():
            lines.append(f'\n["{major}".{kind}]')
            lines.append("names = [")
            lines += [f'    "{n}",' for n in names]
            lines.append("]")
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
