#!/usr/bin/env bash
# Install what pgscope needs on Debian, idempotently: only missing packages are installed, and
# apt-get update runs only when something is missing. Used by `make run` and `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_MAJOR="${PG_MAJOR:-15}"
UV_VERSION="${UV_VERSION:-0.13.9}"
packages=(
  "postgresql-$PG_MAJOR"                  # server, initdb, pgbench (built with --enable-dtrace)
  "postgresql-contrib"                    # contrib extensions (pg_stat_statements, ...)
  "postgresql-$PG_MAJOR-pg-wait-sampling" # second wait-event source, for comparison
  bpftrace                                # USDT and off-CPU tracing
  linux-perf                              # CPU profiles
  python3-venv                            # a private venv for uv
  gcc                                     # builds the shared-memory wait sampler (collect/sampling/native), here only
  libc6-dev                               # its C headers
  chromium                                # tests render the HTML flame graphs headless (playwright drives it)
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) != 0 ]]; then
    echo "setup: missing packages: ${missing[*]}; run as root (or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}" >&2
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

# bpftrace and perf read tracepoints through tracefs; some kernels leave it unmounted.
if [[ $(id -u) == 0 && ! -d /sys/kernel/tracing/events ]]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null \
    || echo "setup: could not mount tracefs; tracing collectors will say so" >&2
fi

# uv manages the project's Python environment from uv.lock; it lives in a private venv so
# that Debian's system Python (PEP 668) stays untouched.
if [[ ! -x .tools/bin/uv ]] || ! .tools/bin/uv --version | grep -q "$UV_VERSION"; then
  python3 -m venv .tools
  .tools/bin/pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi
# Bytecode compiled once here: where PYTHONDONTWRITEBYTECODE is set (CI images often set it),
# every pgscope process would otherwise compile plotly, scipy, pydantic ... from source on
# each start (measured: `pgscope report` 5.5 s -> 1.2 s).
UV_PYTHON_DOWNLOADS=never .tools/bin/uv sync --frozen --quiet --compile-bytecode
.venv/bin/python -m compileall -q src >/dev/null

# The shared-memory sampler (collect/sampling/native/shmem_sampler.c), compiled here, into the package's
# folder, and never at run time: pgscope runs it as root only from there, and only if root owns
# it and everything above it (collect/sampling/activitymem.py). hatch_build.py does the same for a wheel.
sampler_source=src/pgscope/collect/sampling/native/shmem_sampler.c
sampler=src/pgscope/collect/sampling/native/bin/pgscope-shmem-sampler
if [[ ! -x $sampler || $sampler_source -nt $sampler ]]; then
  mkdir -p "$(dirname "$sampler")"
  cc -O2 -o "$sampler.part" "$sampler_source"
  chmod 0755 "$sampler.part"
  mv -f "$sampler.part" "$sampler"
fi

# A program shipped as a wheel: installed from REQUIREMENTS (version and sha256 pinned) into
# FOLDER/site, without its Python dependencies, unless FOLDER already holds exactly those pins;
# then LINK FOLDER REQUIREMENTS points FOLDER/bin at what the caller runs.
install_pinned() {
  local requirements=$1 folder=$2 what=$3 link=$4
  if [[ -f "$folder/.installed" ]] && cmp -s "$requirements" "$folder/.installed"; then
    return 0
  fi
  echo "setup: installing $what into $folder" >&2
  rm -rf "$folder"
  UV_PYTHON_DOWNLOADS=never .tools/bin/uv pip install --quiet --no-deps --require-hashes \
    --python .venv/bin/python --target "$folder/site" -r "$requirements"
  "$link" "$folder" "$requirements"
  cp "$requirements" "$folder/.installed"
}

link_server_bin() {
  local bindir
  bindir=$(cd "$1" && find site -path '*/pginstall/bin' -type d | head -n 1)
  if [[ -z "$bindir" ]]; then
    echo "setup: $2 installed no pginstall/bin folder" >&2
    exit 1
  fi
  ln -sfn "$bindir" "$1/bin"
}

# PostgreSQL 16, 17 and 18 for the version tests (and `--pg-bin`): servers published as
# Python wheels (initdb, postgres, pgbench, most of contrib). They are programs, not libraries
# pgscope imports, so each goes into a folder of its own, outside the project's environment,
# pinned by version and hash (scripts/pg-servers/<major>.txt), without their Python
# dependencies (only their own launcher code needs those). .tools/pg/<major>/bin points at
# the server's bin folder. PGSCOPE_PG_SERVERS="" skips them.
for major in ${PGSCOPE_PG_SERVERS-16 17 18}; do
  install_pinned "scripts/pg-servers/$major.txt" ".tools/pg/$major" "PostgreSQL $major" \
    link_server_bin
done

# The DuckDB CLI the README names (scripts/duckdb-cli.txt, version and sha256 pinned): a
# program, not a library, so it goes into a folder of its own like the servers above. The
# tests open a run's store with it, which shows that the store's storage version is one that
# CLI reads. .tools/duckdb-cli/bin/duckdb is the binary.
link_duckdb_cli() {
  mkdir -p "$1/bin"
  ln -sfn ../site/duckdb_cli/duckdb "$1/bin/duckdb"
  tidy_duckdb_cli "$1"
}

# pip's --target install also writes the wheel's Python launcher, site/bin/duckdb, which cannot
# run from there (ModuleNotFoundError: its module is not on that Python's path): removed, so
# that the only duckdb in the folder is the binary; also from a folder installed before.
tidy_duckdb_cli() {
  rm -rf "$1/site/bin"
}

install_pinned scripts/duckdb-cli.txt .tools/duckdb-cli "the DuckDB CLI" link_duckdb_cli
tidy_duckdb_cli .tools/duckdb-cli
