"""A sweep's results, kept so that a crash or Ctrl-C loses no finished point.

Each finished point is written at once as one small JSON file in a hidden folder beside the output
(`.NAME.sweep/`), atomically (a temporary file, fsync, then os.replace): a point is either whole
there or absent. The table itself (Parquet, or CSV by extension) is rewritten from those rows,
again through a temporary file and os.replace, so it is always a complete table of the points
written so far. A rerun reads the folder (or, if it is gone, the table) and runs the missing points.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson

from tokenpath.config import files
from tokenpath.config.errors import UserError

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
# The table is rewritten at most this often while points finish (and always at the end): rewriting it
# costs time proportional to the rows, and the finished points are safe in the folder meanwhile.
REWRITE_EVERY_S = 1.0


def table_format(out: Path) -> str:
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise UserError(f"--out {files.shown(str(out))}: the file must end in .parquet (or .pq) or .csv")
    return fmt


def pareto_path(out: Path) -> Path:
    """Where the frontier goes: beside the table, `NAME.pareto.csv`."""
    return out.with_name(out.stem + ".pareto.csv")


class ResultStore:
    def __init__(self, out: Path, sweep: str) -> None:
        self.out = out
        self.format = table_format(out)
        self.sweep = sweep
        self.folder = out.parent / f".{out.name}.sweep"
        self.rows: dict[str, dict[str, Any]] = {}
        self._written_at = 0.0

    def load(self) -> None:
        """The rows already finished; a `UserError` if they belong to another sweep."""
        if self.folder.is_dir():
            for part in sorted(self.folder.glob("*.json")):
                try:
                    row = orjson.loads(part.read_bytes())
                except (OSError, orjson.JSONDecodeError):
                    continue  # not a finished point (cannot happen with os.replace, but harmless)
                self._check(row, str(part))
                self.rows[row["point"]] = row
        elif self.out.exists():  # the folder is gone: take the rows from the table itself
            for row in self._read_table():
                self._check(row, str(self.out))
                self.add(row, rewrite=False)

    def _check(self, row: dict[str, Any], where: str) -> None:
        if row.get("sweep") != self.sweep:
            raise UserError(f"--out {files.shown(str(self.out))}: it holds a sweep of another base scenario or other "
                            f"axes ({files.shown(where)}); give a new --out, or delete it and "
                            f"{files.shown(str(self.folder))} to start over")

    def _read_table(self) -> list[dict[str, Any]]:
        try:
            if self.format == "parquet":
                import pyarrow.parquet as pq

                table = pq.read_table(self.out)
            else:
                import pyarrow.csv as pacsv

                table = pacsv.read_csv(self.out)
        except Exception as error:  # pyarrow raises several kinds for a damaged file
            raise UserError(f"--out {files.shown(str(self.out))}: cannot read it as {self.format} ({error}); give "
                            "a new --out") from None
        if "point" not in table.column_names or "sweep" not in table.column_names:
            raise UserError(f"--out {files.shown(str(self.out))}: not a tokenpath sweep table (no 'point' and "
                            "'sweep' columns); give a new --out")
        return table.to_pylist()

    def add(self, row: dict[str, Any], rewrite: bool = True) -> None:
        """Keep a finished point: its file first, then (at most every REWRITE_EVERY_S) the table."""
        self.folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.folder / f"{row['point']}.json", orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY))
        self.rows[row["point"]] = row
        if rewrite and time.monotonic() - self._written_at >= REWRITE_EVERY_S:
            self.write_table()

    def write_table(self, order: list[str] | None = None) -> None:
        """The table of every finished row: in `order` (point ids) first, then any others."""
        import pyarrow as pa

        ids = [pid for pid in (order or []) if pid in self.rows]
        listed = set(ids)
        ids += [pid for pid in self.rows if pid not in listed]
        rows = [self.rows[pid] for pid in ids]
        if not rows:
            return
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise UserError(f"an axis mixes kinds of values that one column cannot hold ({error}); give each "
                            "axis values of one kind") from None
        temporary = self.out.with_name(f".{self.out.name}.tmp")
        if self.format == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, temporary)
        else:
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, temporary)
        os.replace(temporary, self.out)
        self._written_at = time.monotonic()


def _atomic_write(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
