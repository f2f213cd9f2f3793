"""Checksums of snapshot images, read once: the file's digest and a per-page
index in one pass, and the stat facts that let a verified image be trusted
again without reading it.

* **The file digest** is BLAKE3 (cryptographic, ≈ 4.7 GB/s on one core where
  SHA-256 manages 1.8): a snapshot is hashed while its rank already runs, and
  restores used to re-hash every image of the chain.  A manifest names its
  algorithm, so snapshots recorded with SHA-256 still verify.
* **The page index** (``pages-N.idx`` beside ``pages-N.img``) holds one
  xxh3-128 digest per 4 KiB page, in the pages image's order, computed in the
  same pass (xxh3 runs at ≈ 14 GB/s, so it adds a fifth to the digest's time).
  An incremental snapshot compares its pages with its parent's by these
  digests alone: no parent page is read.  128 bits rather than 64 cost the
  same time and make a chance collision (a changed page taken for its
  parent's) out of reach; xxh3 is not built to resist a page crafted to
  collide, which would need an attacker writing the rank's memory.
* **Stat facts** (device, inode, size, mtime and ctime in ns) of every image
  are recorded once its digest is known (at the commit, or after a
  successful verify).  A restore compares them with ``lstat`` and re-hashes
  only when they differ: a rewritten image changes its mtime and ctime, a
  replaced one its inode, and putting an mtime back (``os.utime``) changes the
  ctime, which no call sets back.  What the facts cannot see is damage below
  the file system (a failing disk, a write to the raw device):
  ``prism-debug snapshot verify`` re-hashes every image, always.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal, overload

import blake3
import xxhash

from prism_debug.errors import SnapshotError

ALGORITHMS = ("sha256", "blake3")
DEFAULT = "blake3"
LEGACY = "sha256"  # what a manifest that names no algorithm was checksummed with
PAGE = 4096
INDEX_DIGEST = 16  # bytes of xxh3-128 per page
INDEX_SUFFIX = ".idx"
BLOCK = 8 << 20  # bytes read at a time, into one reused buffer


def hasher(algorithm: str):
    if algorithm == "blake3":
        return blake3.blake3()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise SnapshotError(f"unknown checksum algorithm {algorithm!r} (this prism-debug knows "
                        f"{', '.join(ALGORITHMS)})")


def page_digests(block) -> bytes:
    """The index entries of ``block`` (a whole number of pages, or the file's tail)."""
    view = memoryview(block)
    digest = xxhash.xxh3_128_digest
    return b"".join([digest(view[i:i + PAGE]) for i in range(0, len(view), PAGE)])


@overload
def digest_fd(fd: int, algorithm: str = DEFAULT, *, index: bool = False,
              buffer: bytearray | None = None) -> tuple[str, bytes | None]: ...


@overload
def digest_fd(fd: int, algorithm: None, *, index: Literal[True],
              buffer: bytearray | None = None) -> tuple[None, bytes]: ...


@overload
def digest_fd(fd: int, algorithm: str | None = DEFAULT, *, index: bool = False,
              buffer: bytearray | None = None) -> tuple[str | None, bytes | None]: ...


def digest_fd(fd: int, algorithm: str | None = DEFAULT, *, index: bool = False,
              buffer: bytearray | None = None) -> tuple[str | None, bytes | None]:
    """(hex digest of the whole file or None without an ``algorithm``, its
    page index or None) in one read from offset 0, whatever the descriptor's
    position."""
    buffer = buffer if buffer is not None else bytearray(BLOCK)
    view = memoryview(buffer)
    whole = hasher(algorithm) if algorithm is not None else None
    pages: list[bytes] = []
    offset = 0
    while n := os.preadv(fd, [view], offset):
        if whole is not None:
            whole.update(view[:n])
        if index:
            pages.append(page_digests(view[:n]))
        offset += n
    return whole.hexdigest() if whole is not None else None, \
        b"".join(pages) if index else None


def index_of(path: os.PathLike) -> bytes:
    """The page index of a pages image read now (a dump being compared, or a
    parent recorded before indexes were written)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return digest_fd(fd, None, index=True)[1]
    finally:
        os.close(fd)


def digest_bytes(data: bytes, algorithm: str = DEFAULT) -> str:
    whole = hasher(algorithm)
    whole.update(data)
    return whole.hexdigest()


def facts(info: os.stat_result) -> list[int]:
    """What changes whenever a file's bytes change, short of the disk itself."""
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def write_new(path: Path, data: bytes, durable: bool = False) -> int:
    """Write a file that must not exist yet (0600, never through a link);
    its descriptor, for the caller to fsync (or fsynced here) and close."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd
