"""The user's sources a snapshot keeps, and what changed in them since.

A snapshot's folder holds ``source-<SHA-256>.py`` for each file its rank ran
whose text on disk still had the hash the rank saw at import (the manifest's
``sources`` lists every file, kept or not).  A restore with reload diffs the
files now against those copies and hands the rank the new texts through its
run folder (the control file is read in 64 KiB).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

MAX_SOURCE_BYTES = 4 << 20
_DIGEST = re.compile(r"[0-9a-f]{64}")


def kept_name(digest: str) -> str:
    if not _DIGEST.fullmatch(digest):
        raise ValueError(f"{digest!r:.70} is not a SHA-256")
    return f"source-{digest}.py"


def read_text(path: Path | str) -> tuple[str, str] | None:
    """(text, SHA-256 of its bytes) of a source file, or None where it is
    gone, unreadable, too large or not UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_SOURCE_BYTES:
        return None
    try:
        return data.decode("utf-8"), hashlib.sha256(data).hexdigest()
    except UnicodeDecodeError:
        return None


def keep(folder: Path, sources: Mapping[str, str]) -> dict[str, str]:
    """Copy into ``folder`` (a snapshot's staging) each of ``sources`` (path ->
    SHA-256 when the rank imported it) whose file still has that hash; the
    manifest's ``sources``: every well-formed entry, kept or not."""
    recorded = {}
    for path, digest in sorted(sources.items()):
        if not (isinstance(path, str) and path.startswith("/") and isinstance(digest, str)
                and _DIGEST.fullmatch(digest)):
            continue
        recorded[path] = digest
        now = read_text(path)
        if now is None or now[1] != digest:
            continue  # edited since its import: the snapshot cannot hold what the rank runs
        if (folder / kept_name(digest)).exists():
            continue  # another file with the same text (empty __init__.py files)
        fd = os.open(folder / kept_name(digest),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(now[0])
    return recorded


def changes(folder: Path, sources: Mapping[str, str]
            ) -> dict[str, tuple[str | None, str | None]]:
    """path -> (text at the snapshot, text now) of each source that changed;
    None for a copy the snapshot lacks (or that no longer matches its hash),
    or a file that is gone."""
    changed = {}
    for path, digest in sources.items():
        now = read_text(path)
        if now is not None and now[1] == digest:
            continue
        old = read_text(folder / kept_name(digest))
        changed[path] = (old[0] if old is not None and old[1] == digest else None,
                         now[0] if now is not None else None)
    return changed


def stage(entries: list[dict], folder: Path) -> list[dict]:
    """Write each entry's new text into the run folder (0600) for the rank to
    read; the entries as the control file carries them (``text``: the file,
    ``sha256``: its hash, which the rank checks)."""
    staged = []
    for index, entry in enumerate(entries):
        target = folder / f"reload-{index}.py"
        data = entry["source"].encode("utf-8")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(data)
        staged.append({**{k: v for k, v in entry.items() if k != "source"},
                       "text": str(target), "sha256": hashlib.sha256(data).hexdigest()})
    return staged
