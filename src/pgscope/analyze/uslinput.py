"""A file of measurements for `pgscope fit usl`: clients and throughput, from a CSV whatever
its other columns, with errors that name the file and line. Light on purpose: `fit --help`
lists the column names it knows, and every command's start imports the help."""

from __future__ import annotations

import math

from pgscope.errors import InputFileError

# Header names `read_csv` recognises when a file has more than two columns (any two-column
# file is read as clients then throughput, whatever its header says). `fit usl --help` lists them.
CLIENTS_COLUMNS = ("clients", "client", "concurrency", "connections", "threads", "users", "n")
THROUGHPUT_COLUMNS = ("throughput", "tps", "qps", "ops", "rate", "x")


def _numbers(row: list[str]) -> bool:
    try:
        for cell in row:
            float(cell)
    except ValueError:
        return False
    return True


def _columns(path: str, header: list[str]) -> tuple[int, int]:
    """Which columns hold clients and throughput, from a header row."""
    named = [h.strip().lower() for h in header]
    clients = next((named.index(n) for n in CLIENTS_COLUMNS if n in named), None)
    throughput = next((named.index(n) for n in THROUGHPUT_COLUMNS if n in named), None)
    if clients is not None and throughput is not None:
        return clients, throughput
    if len(named) == 2:
        return 0, 1
    raise InputFileError(
        f"{path}:1: cannot tell which columns are clients and throughput in "
        f"{','.join(header)!r}; name them (clients: {', '.join(CLIENTS_COLUMNS)}; "
        f"throughput: {', '.join(THROUGHPUT_COLUMNS)}) or give just the two columns"
    )


# What `fit` reads of a file: measurements are a few lines; a file past these is not one
# (`fit usl /dev/zero` read until the memory ran out).
MAX_CSV_BYTES = 4 * 2**20
MAX_CSV_POINTS = 100_000


def _csv_text(path: str) -> str:
    """The file's text, at most MAX_CSV_BYTES of it; a binary file (a NUL byte, bytes that
    are not UTF-8) is an error, not a CSV."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CSV_BYTES + 1)
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror}") from None
    if b"\0" in data:
        raise InputFileError(f"{path}: binary (a NUL byte), not a CSV file of measurements")
    if len(data) > MAX_CSV_BYTES:
        raise InputFileError(
            f"{path}: more than {MAX_CSV_BYTES // 2**20} MiB; a CSV of measurements is a few "
            f"lines (clients, throughput)"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputFileError(
            f"{path}: not a CSV text file: byte 0x{data[exc.start]:02x} at offset {exc.start} "
            f"is not UTF-8"
        ) from None


def read_csv(path: str) -> tuple[list[float], list[float]]:
    """Read clients and throughput measurements: two numeric columns with or without a
    header row, or named columns among others; errors name the file and line."""
    import csv
    import io

    reader = csv.reader(io.StringIO(_csv_text(path), newline=""))
    clients: list[float] = []
    throughput: list[float] = []
    columns: tuple[int, int] | None = None
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            line = reader.line_num
            if columns is None:
                if not _numbers(row):
                    columns = _columns(path, row)
                    continue
                columns = (0, 1)  # no header: the first two columns
            ci, ti = columns
            try:
                c, t = float(row[ci]), float(row[ti])
            except (ValueError, IndexError):
                raise InputFileError(
                    f"{path}:{line}: expected two numbers, got {','.join(row)!r}"
                ) from None
            if not (math.isfinite(c) and math.isfinite(t)) or c < 1 or t < 0:
                raise InputFileError(
                    f"{path}:{line}: clients must be >= 1 and throughput "
                    f">= 0, got {','.join(row)!r}"
                )
            if len(clients) == MAX_CSV_POINTS:
                raise InputFileError(
                    f"{path}:{line}: more than {MAX_CSV_POINTS:,} measurements; fit takes "
                    f"at most that many"
                )
            clients.append(c)
            throughput.append(t)
    except csv.Error as exc:
        raise InputFileError(f"{path}: not a CSV file: {exc}") from None
    if columns is None:
        raise InputFileError(f"{path}: empty file")
    return clients, throughput
