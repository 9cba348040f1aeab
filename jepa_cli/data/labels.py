"""Labels and groups of the files of a source folder (images, videos, audio alike): from class
sub-folders, a labels CSV or a regex over the file names, and a group per file from a regex over its
path or a column of the CSV (docs/formats.md, "Labels and groups").

Every function here takes the source's items (files, or frame folders of a video source) in source
order and returns one name per item; `class_ids` turns names into the int32 labels a dataset stores.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import regex

from jepa_cli.data.files import check_regular
from jepa_cli.data.store import utf8_text
from jepa_cli.errors import InputError


@dataclass(frozen=True)
class Naming:
    """Where the labels and groups of a folder's items come from, as the user gave it (None: not given)."""

    labels_csv: str | None = None  # a CSV: path,label rows (or a header naming path, label, group columns)
    label_regex: str | None = None  # searched in each item's stem
    group_regex: str | None = None  # searched in each item's path relative to the folder
    group_column: str | None = None  # a column of the labels CSV

    def __post_init__(self):
        if self.labels_csv and self.label_regex:
            raise InputError("give --labels or --label-regex, not both")
        if self.group_regex and self.group_column:
            raise InputError("give --group-regex or --group-column, not both")
        if self.group_column and not self.labels_csv:
            raise InputError(f"--group-column {self.group_column!r} names a column of the --labels CSV; give "
                             "--labels FILE.csv too, or use --group-regex")

    @property
    def grouped(self) -> bool:
        return bool(self.group_regex or self.group_column)

    @property
    def relabels(self) -> bool:
        """Whether the labels come from a CSV or a regex rather than from the folders."""
        return bool(self.labels_csv or self.label_regex)

    def provenance(self) -> dict[str, Any]:
        """How the groups were found, for the dataset's `split` attribute."""
        return {"group_regex": self.group_regex} if self.group_regex else {"group_column": self.group_column}


@dataclass
class Named:
    """Names found for a folder's items: labels (None: unlabelled) and groups (None: not grouped)."""

    labels: list[str] | None
    groups: list[str] | None


def name_items(root: Path, items: list[Path], naming: Naming, what: str,
               folder_labels: list[str] | None) -> Named:
    """The label and group of each of `items` (under `root`) as `naming` says; `folder_labels` are the
    labels the folder's layout gives, kept unless a CSV or a regex replaces them. `what` names the
    items in errors ("audio files", "image files", "videos")."""
    labels, groups = folder_labels, None
    if naming.labels_csv:
        labels, groups = csv_names(root, items, Path(naming.labels_csv), what, naming.group_column)
    elif naming.label_regex:
        labels = regex_names([p.stem for p in items], naming.label_regex, "--label-regex", items)
    if naming.group_regex:
        groups = regex_names([relative(root, p) for p in items], naming.group_regex, "--group-regex", items)
    return Named(labels, groups)


def relative(root: Path, item: Path) -> str:
    """`item`'s path under `root` with `/`, as a labels CSV names it and --group-regex sees it."""
    return item.relative_to(root).as_posix() if item != root else item.name


def class_ids(names: list[str] | None) -> tuple[np.ndarray | None, list[str]]:
    """int32 indices into the sorted distinct names, and those names (as image class folders are)."""
    if names is None:
        return None, []
    ordered = sorted(set(names))
    lookup = {name: i for i, name in enumerate(ordered)}
    return np.asarray([lookup[n] for n in names], np.int32), utf8_text(ordered)


def int32_labels(values: np.ndarray, where: str) -> np.ndarray:
    """Stored labels as int32 class indices; InputError naming `where` for labels that are not
    integers or do not fit int32 (a cast would wrap them into other classes silently)."""
    values = np.asarray(values)
    if values.dtype.kind not in "biu":
        raise InputError(f"{where}: labels must be integer class indices, got {values.dtype}")
    info = np.iinfo(np.int32)
    if values.size and values.dtype.kind != "b" and (values.min() < info.min or values.max() > info.max):
        raise InputError(f"{where}: labels must fit int32 ([{info.min}, {info.max}]), got min {values.min()}, "
                         f"max {values.max()}")
    return values.astype(np.int32)


def folder_labels(root: Path, files: list[Path], what: str) -> list[str] | None:
    """The top-level folder of each file, or None when every file lies directly in `root`."""
    nested = [len(f.relative_to(root).parts) > 1 for f in files]
    if not any(nested):
        return None
    loose = next((f for f, n in zip(files, nested) if not n), None)
    if loose is not None:
        raise InputError(utf8_text(f"{loose}: lies outside the class folders of {root} (move it into one, or "
                                   f"label the {what} with --labels or --label-regex)"))
    return [f.relative_to(root).parts[0] for f in files]


REGEX_TIMEOUT_S = 1.0  # a user's regex searching one name: a sane one takes microseconds


def regex_names(keys: list[str], pattern: str, flag: str, items: list[Path]) -> list[str]:
    """The name each key gives under `re.search(pattern, key)`: its first named group that took part
    in the match, else its first group that did, else the whole match. A regex that does not compile,
    matches no key, leaves a key without a name, or searches one key longer than REGEX_TIMEOUT_S
    (catastrophic backtracking) is an InputError naming `flag` (and an item)."""
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise InputError(f"{flag} {pattern!r} is not a valid regular expression ({exc})") from None
    named = sorted(compiled.groupindex.values())
    names: list[str | None] = []
    for key in keys:
        try:
            m = compiled.search(key, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            raise InputError(utf8_text(f"{flag} {pattern!r} takes more than {REGEX_TIMEOUT_S:g} s on the name "
                                       f"{key!r} (it backtracks without end); write it without nested "
                                       "repetition such as (a+)+")) from None
        if m is None:
            names.append(None)
            continue
        taking_part = [g for g in [m.group(i) for i in named] + list(m.groups()) if g is not None]
        names.append((taking_part[0] if taking_part else m.group(0)) or None)
    missed = [item for item, name in zip(items, names) if name is None]
    if len(missed) == len(keys):
        raise InputError(utf8_text(f"{flag} {pattern!r} matches none of the {len(keys)} names it is searched in, "
                                   f"e.g. {keys[0]!r}"))
    if missed:
        raise InputError(utf8_text(f"{flag} {pattern!r} gives no name to {len(missed)} of the files, first "
                                   f"{missed[0]}"))
    return names  # type: ignore[return-value]


def csv_names(root: Path, items: list[Path], csv_path: Path, what: str,
              group_column: str | None = None) -> tuple[list[str], list[str] | None]:
    """The label of each of `items` from a labels CSV, and its group from the column `group_column`.

    Rows are `path,label` (an optional `path,label` header), or a header naming a `path` and a `label`
    column among others; paths are relative to `root` with `/`. Read as UTF-8 with or without the
    byte-order mark spreadsheets write; a path named twice is an InputError giving both line numbers,
    as is a path that is not one of `items` or an item without a row."""
    header, rows = _read_rows(csv_path)
    group_column = group_column.strip().lower() if group_column else None  # header names are read lower-case
    if header is None:
        if group_column:
            raise InputError(f"{csv_path}: has no header row, so no column {group_column!r}; start it with a "
                             f"header such as 'path,label,{group_column}'")
        header = ["path", "label"]
    for column in ("path", "label") + ((group_column,) if group_column else ()):
        if column not in header:
            raise InputError(utf8_text(f"{csv_path}: has no column {column!r} (its columns: {', '.join(header)})"))
    at = {name: header.index(name) for name in header}
    by_path: dict[str, tuple[str, str | None]] = {}
    line_of: dict[str, int] = {}
    for line, row in rows:
        cells = [c.strip() for c in row]
        wanted = [at["path"], at["label"]] + ([at[group_column]] if group_column else [])
        if len(cells) != len(header) or not all(cells[i] for i in wanted):
            raise InputError(f"{csv_path}: line {line} is not '{','.join(header)}': {','.join(row)[:80]!r}")
        key = Path(cells[at["path"]]).as_posix()
        if key in line_of:
            raise InputError(utf8_text(f"{csv_path}: names {key!r} twice, on lines {line_of[key]} and {line}; "
                                       "give each file one label"))
        by_path[key] = (cells[at["label"]], cells[at[group_column]] if group_column else None)
        line_of[key] = line
    keys = [relative(root, item) for item in items]
    missing = sorted(set(by_path) - set(keys))
    if missing:
        raise InputError(utf8_text(f"{csv_path}: names {len(missing)} file(s) that are not {what} in {root}, "
                                   f"first {missing[0]!r}"))
    unlabelled = [key for key in keys if key not in by_path]
    if unlabelled:
        raise InputError(utf8_text(f"{csv_path}: has no label for {len(unlabelled)} {what} of {root}, "
                                   f"first {unlabelled[0]!r}"))
    labels = [by_path[key][0] for key in keys]
    return labels, ([by_path[key][1] for key in keys] if group_column else None)  # type: ignore[misc]


def _read_rows(csv_path: Path) -> tuple[list[str] | None, list[tuple[int, list[str]]]]:
    """The header (lower-cased column names; None when the first row has no `path` column) and the
    other non-blank rows of a CSV, each with the line number where it starts."""
    check_regular(csv_path)  # a named pipe would be read forever
    if not csv_path.is_file():
        raise InputError(f"{csv_path}: no such labels file")
    rows: list[tuple[int, list[str]]] = []
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            line = 1
            for row in reader:
                if row and any(c.strip() for c in row):
                    rows.append((line, row))
                line = reader.line_num + 1
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{csv_path}: not a UTF-8 CSV file of path,label rows ({exc})") from None
    if rows and "path" in [c.strip().lower() for c in rows[0][1]]:
        return [c.strip().lower() for c in rows[0][1]], rows[1:]
    return None, rows
