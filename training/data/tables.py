"""Caption tables: CSV / TSV files, parquet files (or folders of them) and `datasets` folders written by
``save_to_disk`` (Arrow files), read row by row.

One row is one caption of one image (the layout of open_clip's CSVs and of clip-retrieval's and
img2dataset's parquet files): rows that name the same image file are that image's captions. Columns:

- **image**: the image's path, relative to the table's folder or ``--images-root`` (an absolute
  path must lie inside that root; ``..`` is refused): ``image_path``, ``filepath``, ``image``,
  ``filename``, ``file_name``, ``path`` — the first that exists, or ``columns="image=COL"``.
- **caption** (optional): ``caption``, ``text``, ``title``, ``sentence``, ``raw``, or
  ``caption=COL``; a parquet list-of-strings cell holds several captions. Without one the images
  have no captions (searchable, nothing to evaluate).
- **split** (optional): ``split`` or ``split=COL``; rows without one are test rows.
- **metadata**: every other column (or ``metadata=A|B``; ``metadata=`` for none), taken from the
  image's first row and made JSON-safe (NaN → null, dates → ISO text, bytes dropped).

Nothing but the current batch of rows is held while reading (CSV: the csv module over the open
file; parquet: ``iter_batches`` of the needed columns), so the table itself may be larger than memory;
what is kept is one small record per image and per caption (:mod:`.formats`).
"""
from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from training.data.karpathy import DatasetError

IMAGE_COLUMNS = ("image_path", "filepath", "image", "filename", "file_name", "path")
CAPTION_COLUMNS = ("caption", "captions", "text", "title", "sentence", "raw")
SPLIT_COLUMNS = ("split",)
ROLES = ("image", "caption", "split", "metadata")
MAX_DEPTH = 8  # nesting of a JSON-safe metadata value
csv.field_size_limit(1 << 24)  # a 16 MB cell at most (the default 128 KB refuses long metadata text)


@dataclass
class Row:
    """One row of a corpus file: an image (a path as written, or a shard member), its captions, split
    and metadata; ``where`` names the row in messages."""

    image: object
    captions: list[str]
    split: str | None
    metadata: dict = field(default_factory=dict)
    where: str = ""


def parse_columns(spec: str) -> dict[str, object]:
    """``"image=COL,caption=COL,split=COL,metadata=A|B"`` → ``{role: column}`` (``metadata``: a list)."""
    out: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        role, eq, col = part.partition("=")
        role = role.strip()
        if not eq or role not in ROLES:
            raise DatasetError(f"columns {spec!r}: {part!r} is not ROLE=COLUMN with ROLE one of {', '.join(ROLES)}")
        out[role] = [c.strip() for c in col.split("|") if c.strip()] if role == "metadata" else col.strip()
    return out


def pick_columns(names: list[str], spec: str, where: str) -> dict[str, object]:
    """Which column plays which role (given in ``spec`` or found by name); every named column must exist."""
    given = parse_columns(spec)
    lower = {n.lower(): n for n in names}

    def find(role: str, candidates: tuple[str, ...]) -> str | None:
        if role in given:
            if given[role] and given[role] not in names:
                raise DatasetError(f"{where}: no column {given[role]!r} (columns: {', '.join(names)})")
            return given[role] or None
        return next((lower[c] for c in candidates if c in lower), None)

    roles = {"image": find("image", IMAGE_COLUMNS), "caption": find("caption", CAPTION_COLUMNS),
             "split": find("split", SPLIT_COLUMNS)}
    if roles["image"] is None:
        raise DatasetError(f"{where}: no image column (one of {', '.join(IMAGE_COLUMNS)}, or columns=image=COL); "
                           f"columns: {', '.join(names)}")
    if "metadata" in given:
        missing = [c for c in given["metadata"] if c not in names]
        if missing:
            raise DatasetError(f"{where}: no metadata column {missing[0]!r} (columns: {', '.join(names)})")
        roles["metadata"] = list(given["metadata"])
    else:
        roles["metadata"] = [n for n in names if n not in (roles["image"], roles["caption"], roles["split"])]
    return roles


def json_safe(value: object, depth: int = 0) -> object:
    """A metadata value as plain JSON: numbers (NaN/inf → None), text, bools, lists and objects;
    dates as ISO text; bytes and anything nested deeper than ``MAX_DEPTH`` → None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and not isinstance(value, (bytes, bytearray)):  # numpy scalars
        try:
            return json_safe(value.item(), depth)
        except (TypeError, ValueError):
            pass
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if depth >= MAX_DEPTH or isinstance(value, (bytes, bytearray, memoryview)):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    return str(value)


def _captions(cell: object) -> list[str]:
    if cell is None:
        return []
    cells = cell if isinstance(cell, (list, tuple)) else [cell]
    return [c.strip() for c in (str(x) for x in cells if x is not None) if c.strip()]


def _split(cell: object) -> str | None:
    s = str(cell).strip() if cell is not None else ""
    return s or None


def read_csv(path: Path, columns: str = "") -> Iterator[Row]:
    """Rows of a CSV (``.csv``) or tab-separated (``.tsv``, ``.tab``) file with a header line."""
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter=delimiter)
            header = next(reader, None)
            if not header:
                raise DatasetError(f"{path}: empty file (a header line naming the columns is needed)")
            header = [h.strip().lstrip("\ufeff") for h in header]
            roles = pick_columns(header, columns, str(path))
            pos = {n: i for i, n in enumerate(header)}
            for line, cells in enumerate(reader, start=2):
                if not cells or not any(c.strip() for c in cells):
                    continue
                if len(cells) != len(header):
                    raise DatasetError(f"{path}:{line}: {len(cells)} cells, but the header names {len(header)} columns")
                yield _row({n: cells[pos[n]] for n in header}, roles, f"{path}:{line}")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
    except csv.Error as e:
        raise DatasetError(f"{path}: not a readable {'TSV' if delimiter == chr(9) else 'CSV'} file ({e})") from None


def _row(cells: dict, roles: dict, where: str) -> Row:
    image = cells.get(roles["image"])
    if image is None or not str(image).strip():
        raise DatasetError(f"{where}: the image column {roles['image']!r} is empty")
    return Row(image=str(image).strip(), captions=_captions(cells.get(roles["caption"])) if roles["caption"] else [],
               split=_split(cells.get(roles["split"])) if roles["split"] else None,
               metadata={c: json_safe(cells.get(c)) for c in roles["metadata"]}, where=where)


def parquet_files(path: Path) -> list[Path]:
    """A parquet file, or the ``*.parquet`` files of a folder in name order."""
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise DatasetError(f"{path}: no .parquet files in this folder")
    return files


def read_parquet(path: Path, columns: str = "", batch_rows: int = 4096) -> Iterator[Row]:
    """Rows of a parquet file or of a folder of them (same columns in each), one batch at a time."""
    for file in parquet_files(path):
        try:
            pf = pq.ParquetFile(file)
        except (pa.ArrowException, OSError) as e:
            raise DatasetError(f"{file}: not a readable parquet file ({type(e).__name__}: {str(e)[:160]})") from None
        yield from _arrow_rows(file, pf.schema_arrow, lambda cols, pf=pf: pf.iter_batches(batch_size=batch_rows,
                                                                                          columns=cols), columns)


# ---- a `datasets` folder (``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``) ----------------------
ARROW_INFO = ("dataset_info.json", "state.json")


def is_saved_dataset(path: Path) -> bool:
    """A folder that ``datasets``' ``save_to_disk`` wrote: a Dataset (``state.json`` beside ``*.arrow``) or a
    DatasetDict (``dataset_dict.json`` and one such folder per split)."""
    p = Path(path)
    if not p.is_dir():
        return False
    if (p / "dataset_dict.json").is_file():
        return True
    return (p / "state.json").is_file() and any(p.glob("*.arrow"))


def saved_dataset_parts(path: Path) -> list[tuple[str | None, list[Path]]]:
    """(split from the folder, its ``*.arrow`` files in name order) per part of a saved dataset. A
    DatasetDict's splits are its subfolders (names of plain characters only; a symlink out is refused)."""
    p = Path(path)
    if not (p / "dataset_dict.json").is_file():
        return [(None, _arrow_files(p))]
    parts = []
    for sub in sorted(d for d in p.iterdir() if d.is_dir() and (d / "state.json").is_file()):
        if sub.is_symlink() or not sub.resolve().is_relative_to(p.resolve()):
            raise DatasetError(f"{sub}: a split folder that leads outside the dataset folder")
        parts.append((sub.name, _arrow_files(sub)))
    if not parts:
        raise DatasetError(f"{p}: dataset_dict.json but no split folders with state.json")
    return parts


def _arrow_files(folder: Path) -> list[Path]:
    files = sorted(f for f in folder.glob("*.arrow") if f.is_file() and not f.is_symlink())
    if not files:
        raise DatasetError(f"{folder}: no .arrow files (not a `datasets` save_to_disk folder)")
    return files


def read_saved_dataset(path: Path, columns: str = "", batch_rows: int = 4096) -> Iterator[Row]:
    """Rows of a ``save_to_disk`` folder, streamed batch by batch from its Arrow files (memory-mapped).
    The image column holds paths: a string column, or ``datasets``' Image feature (``{bytes, path}``)
    saved with paths only; images stored inside the Arrow files are refused, as in parquet. A
    DatasetDict's split is its folder's name (``validation`` → val) unless a split column says otherwise."""
    for split, files in saved_dataset_parts(path):
        for file in files:
            try:
                source = pa.memory_map(str(file))
                reader = pa.ipc.open_stream(source)
            except (pa.ArrowException, OSError) as e:
                raise DatasetError(f"{file}: not a readable Arrow stream ({type(e).__name__}: {str(e)[:160]})") from None

            def batches(cols: list[str], reader=reader):
                for batch in reader:
                    yield batch.select(cols)

            for row in _arrow_rows(file, reader.schema, batches, columns):
                yield row if row.split or split is None else Row(row.image, row.captions, split, row.metadata, row.where)


def _image_path_type(t: pa.DataType) -> str | None:
    """``"string"`` for a path column, ``"image"`` for ``datasets``' Image struct, else None."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} == {"bytes", "path"}:
        return "image"
    return None


def _arrow_rows(file: Path, schema: pa.Schema, batches, columns: str) -> Iterator[Row]:
    """Rows of one Arrow-typed table (parquet file or Arrow stream) whose ``batches(columns)`` yields
    record batches of just those columns."""
    roles = pick_columns(list(schema.names), columns, str(file))
    kind = _image_path_type(schema.field(roles["image"]).type)
    if kind is None:
        raise DatasetError(f"{file}: the image column {roles['image']!r} holds {schema.field(roles['image']).type}, "
                           "not paths; images stored inside a table are not read (put them in webdataset shards, "
                           "or write them to files)")
    metadata = [c for c in roles["metadata"] if not pa.types.is_binary(schema.field(c).type)
                and _image_path_type(schema.field(c).type) != "image"]
    roles = {**roles, "metadata": metadata}
    wanted = list(dict.fromkeys(c for c in (roles["image"], roles["caption"], roles["split"], *metadata) if c))
    row_no = 0
    try:
        for batch in batches(wanted):
            for cells in batch.to_pylist():
                row_no += 1
                if kind == "image":
                    cells[roles["image"]] = _image_feature_path(cells.get(roles["image"]), f"{file}: row {row_no}")
                yield _row(cells, roles, f"{file}: row {row_no}")
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{file}: unreadable after row {row_no} ({type(e).__name__}: {str(e)[:160]})") from None


def _image_feature_path(cell: object, where: str) -> str | None:
    if not isinstance(cell, dict):
        return None
    if cell.get("bytes") is not None:
        raise DatasetError(f"{where}: the image is stored inside the dataset (Image feature with bytes); images "
                           "stored inside a table are not read (save the dataset with image paths, or use "
                           "webdataset shards)")
    return cell.get("path")
