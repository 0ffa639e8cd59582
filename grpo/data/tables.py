"""A task's rows from any tabular form, each row with where it came from (file and line or row).

Forms, detected from the path in this order:
  builder + data_files      datasets.load_dataset(builder, data_files=[file]) per file (any packaged builder:
                            "json", "csv", "parquet", "arrow", "text", ...)
  a save_to_disk folder     datasets.load_from_disk (a Dataset, or a DatasetDict and its split)
  a folder of data files    every .jsonl / .json / .csv / .tsv / .parquet / .arrow file under it, in path order,
                            each read as below
  a .jsonl / .json file     grpo/data/json_rows.read_records: JSON lines, one array, or concatenated objects
  a .csv / .tsv file        datasets "csv" builder, every column read as text; a UTF-8 byte-order mark (Excel's
                            "CSV UTF-8") is dropped; a row whose field count differs from the header's is an
                            error naming <file>:<line> (checked first: datasets' own error names no line)
  a .parquet / .arrow file  datasets "parquet" / "arrow" builder
  "owner/name"              the Hugging Face Hub through datasets.load_dataset, when the Hub can be reached

Why JSON files are not read by datasets' "json" builder (they still can be: builder="json"): measured with
datasets 5.2, that builder rejects a whole file for one blank line or for a column whose type changes between rows
("answer": "5" then "answer": 5), and its errors name no line. The shared reader skips, counts and names each bad
line (file:line) like the BBQ and HaluEval loaders do. Why CSV columns are text: CSV has no types, and inference
turns an id "007" into 7 and an answer "1e3" into 1000.0.

A Hub id is tried only after a quick connection check (`HUB_PROBE_TIMEOUT_S`): offline, datasets retries for a long
while per file before failing (docs/RESULTS.md, "Figures behind constants"); here the error comes at once and says
what to do. With HF_HUB_OFFLINE=1 or
HF_DATASETS_OFFLINE=1 the local cache is used and nothing is probed.
"""

from __future__ import annotations

import csv
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from grpo.core.plumbing import cache_error
from grpo.data.json_rows import DataFileError, RecordsRead, read_records

JSON_SUFFIXES = (".jsonl", ".json")
BUILDER_OF_SUFFIX = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
DATA_SUFFIXES = JSON_SUFFIXES + tuple(BUILDER_OF_SUFFIX)
HUB_PROBE_TIMEOUT_S = 3.0  # a TCP connect to the Hub answers in well under a second when there is a network
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "name" or "owner/name", as the Hub spells ids
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


class DataSourceError(DataFileError):
    """A data source cannot be read (missing, unknown form, unreachable Hub, missing split). Names the source."""


def _datasets():
    try:
        import datasets  # lazy: a heavy import, needed only for non-JSON forms
    except ImportError as err:
        raise DataSourceError("reading CSV / Parquet / save_to_disk / Hub data needs the 'datasets' package: "
                              "pip install datasets") from err
    return datasets


def is_saved_dataset(folder: Path) -> bool:
    """A folder written by Dataset.save_to_disk (state.json) or DatasetDict.save_to_disk (dataset_dict.json)."""
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def looks_like_hub_id(path: str) -> bool:
    """"owner/name" (or "name") with no data-file suffix and not written as a local path (./, /, ~)."""
    return bool(HUB_ID.match(path)) and not path.lower().endswith(DATA_SUFFIXES) and not path.startswith(".")


def data_files_in(folder: Path) -> list[Path]:
    """The data files under `folder` (recursively, hidden ones skipped), in path order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in DATA_SUFFIXES
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _from_table(table: Any, origin: str) -> RecordsRead:
    """A datasets.Dataset as rows numbered from 1 (its data rows; for a CSV file, row n is on line n + 1)."""
    read = RecordsRead(path=origin, unit="row")
    read.rows = [(index + 1, dict(row)) for index, row in enumerate(table)]
    return read


CSV_ENCODING = "utf-8-sig"
"""UTF-8, a leading byte-order mark dropped (else the first column's name would start with \\ufeff)."""
CSV_FIELD_LIMIT = 2**31 - 1
"""The csv module's largest field while the rows are checked (its default, 128 KiB, would refuse a long document
that datasets reads); the largest value its C long takes on every platform."""


def _csv_header(file: Path, delimiter: str, where: str) -> list[str]:
    """The header of a CSV / TSV file, after checking that every row has as many fields as it (blank lines are
    skipped, as datasets skips them); DataSourceError naming <file>:<line> for the first row that does not, or for a
    file that is not UTF-8."""
    limit = csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        with file.open(newline="", encoding=CSV_ENCODING) as handle:
            reader = csv.reader(handle, delimiter=delimiter)
            header = next(reader, None)
            if not header:
                raise DataSourceError(f"{where}: {file} is empty: a CSV file needs a header row naming its columns")
            start = reader.line_num + 1  # the line the next row starts on (a quoted field may span lines)
            for row in reader:
                if row and len(row) != len(header):
                    raise DataSourceError(
                        f"{where}: {file}:{start}: this row has {len(row)} field(s), the header has {len(header)} "
                        f"({', '.join(header)}); quote a field that holds the delimiter {delimiter!r}, and give "
                        "every row every column (an empty one as nothing between two delimiters)")
                start = reader.line_num + 1
    except UnicodeDecodeError as err:
        raise DataSourceError(f"{where}: {file} is not UTF-8 text ({err.reason} at byte {err.start}); save it as "
                              "UTF-8 (CSV UTF-8)") from None
    except csv.Error as err:  # e.g. a NUL byte
        raise DataSourceError(f"{where}: {file}:{reader.line_num}: cannot be read as CSV: {err}") from None
    finally:
        csv.field_size_limit(limit)
    return header


def _load(builder: str, file: Path, where: str) -> RecordsRead:
    """One local file through datasets.load_dataset, with a message naming the file when it does not parse."""
    datasets = _datasets()
    kwargs: dict[str, Any] = {}
    if builder == "csv":
        delimiter = "\t" if file.suffix.lower() == ".tsv" else ","
        header = _csv_header(file, delimiter, where)
        kwargs["features"] = datasets.Features({name: datasets.Value("string") for name in header})
        kwargs["encoding"] = CSV_ENCODING
        if delimiter != ",":
            kwargs["delimiter"] = delimiter
    try:
        table = datasets.load_dataset(builder, data_files=[str(file)], split="train", **kwargs)
    except Exception as err:  # datasets and pyarrow raise many types for one bad file; all mean "cannot read it"
        cache = cache_error(err, datasets.config.HF_DATASETS_CACHE, "the datasets cache (HF_DATASETS_CACHE)")
        if cache is not None:  # datasets writes every file it reads into its cache: a HOME it cannot write
            raise DataSourceError(f"{where}: {file} cannot be read: {cache}") from None
        raise DataSourceError(f"{where}: {file} cannot be read as {builder!r}: {type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}") from err
    return _from_table(table, str(file))


def read_file(file: Path, where: str, builder: str = "") -> RecordsRead:
    """The rows of one data file; `builder` "" = chosen from the suffix."""
    suffix = file.suffix.lower()
    if not builder and suffix in JSON_SUFFIXES:
        return read_records(file)
    builder = builder or BUILDER_OF_SUFFIX.get(suffix, "")
    if not builder:
        raise DataSourceError(f"{where}: {file} has suffix {suffix!r}; data files are {', '.join(DATA_SUFFIXES)} "
                              "(or name a datasets builder in `builder`)")
    return _load(builder, file, where)


def _split_of(saved: Any, split: str, origin: str, where: str) -> Any:
    if not hasattr(saved, "keys"):  # a Dataset: one table, no split names
        if split != "train":
            raise DataSourceError(f"{where}: {origin} holds one dataset without splits, so split {split!r} does "
                                  "not exist; use split train, or save a DatasetDict")
        return saved
    if split not in saved:
        raise DataSourceError(f"{where}: {origin} has splits {sorted(saved.keys())}, not {split!r}")
    return saved[split]


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """(whether a TCP connection to the Hub endpoint opens, the endpoint). HF_ENDPOINT is honoured."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
    except OSError:
        return False, endpoint
    return True, endpoint


def _read_hub(name: str, config_name: str, split: str, where: str) -> RecordsRead:
    datasets = _datasets()
    offline = any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARS)
    if not offline:
        ok, endpoint = hub_reachable()
        if not ok:
            raise DataSourceError(
                f"{where}: {name!r} is not a local file or folder, and the Hugging Face Hub ({endpoint}) cannot be "
                "reached (offline?). Download it where there is a network (datasets.load_dataset(...)."
                "save_to_disk(folder)) and point the path at that folder, or set HF_HUB_OFFLINE=1 to read it from "
                "the local datasets cache")
    origin = f"hub:{name}" + (f"[{config_name}]" if config_name else "") + f":{split}"
    try:
        table = datasets.load_dataset(name, name=config_name or None, split=split)
    except Exception as err:  # missing dataset, config or split; gated; not cached offline: all "cannot read it"
        raise DataSourceError(f"{where}: Hub dataset {name!r} (config {config_name or 'default'!r}, split "
                              f"{split!r}) cannot be loaded: {type(err).__name__}: {err}") from err
    return _from_table(table, origin)


def read_tables(path: str, *, where: str, builder: str = "", data_files: list[str] | tuple[str, ...] = (),
                split: str = "train", config_name: str = "") -> list[RecordsRead]:
    """Every table of one source, in order; `where` (e.g. "tasks.math") prefixes every error.

    Rows that did not parse (JSON files only) are counted in each table's `.skipped` / `.problems`."""
    if builder:
        files = [Path(f).expanduser() for f in (data_files or ([path] if path else []))]
        if not files:
            raise DataSourceError(f"{where}: builder {builder!r} needs data_files (or a path) to read")
        absent = [str(f) for f in files if not f.exists()]
        if absent:
            raise DataSourceError(f"{where}: data files not found: {absent}")
        expanded = [g for f in files for g in (data_files_in(f) if f.is_dir() else [f])]
        return [read_file(f, where, builder) for f in expanded]
    local = Path(path).expanduser()
    if local.is_dir():
        if is_saved_dataset(local):
            saved = _datasets().load_from_disk(str(local))
            return [_from_table(_split_of(saved, split, str(local), where), f"{local}:{split}")]
        files = data_files_in(local)
        if not files:
            raise DataSourceError(f"{where}: folder {local} holds no data files ({', '.join(DATA_SUFFIXES)}) and "
                                  "was not written by save_to_disk")
        return [read_file(f, where) for f in files]
    if local.is_file():
        return [read_file(local, where)]
    if looks_like_hub_id(path):
        return [_read_hub(path, config_name, split, where)]
    raise DataSourceError(f"{where}: {path!r} does not exist (a file, a folder, or a Hub id 'owner/name')")

