"""Crash-safe writes: a reader sees the old file (or folder) or the new one, never a half-written one.

Each writer fills a temp name in the same folder, flushes it to disk (fsync), renames it onto the final
name with ``os.replace`` and then fsyncs the folder so the rename itself survives a power cut. Temp names
start with a dot and carry the pid and a random suffix, so ``*.json`` listings never see them and two
processes or threads never share one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

FILE_MODE, PRIVATE_FILE_MODE, PRIVATE_DIR_MODE = 0o644, 0o600, 0o700


def _temp_path(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}.{suffix}")


def _make_parent(folder: Path, private: bool) -> None:
    """Create ``folder`` and its missing parents; when private, each folder created (and ``folder``) is 0700."""
    if not private:
        folder.mkdir(parents=True, exist_ok=True)
        return
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        with contextlib.suppress(FileExistsError):
            created.mkdir(mode=PRIVATE_DIR_MODE)
        os.chmod(created, PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask
    if not missing:
        os.chmod(folder, PRIVATE_DIR_MODE)


def _fsync_dir(folder: Path) -> None:
    """Persist a rename in ``folder``; best effort where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)  # Windows fsyncs writable handles only
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, private: bool = False) -> Iterator[Path]:
    """Yield a temp path next to ``path`` for a writer that needs a file name (``save_file``, ``torch.save``).

    On normal exit the temp is fsynced and renamed onto ``path``; on an exception it is removed, the old
    ``path`` is left as it was, and the exception propagates. ``private``: file 0600, created folders 0700.
    """
    path = Path(path)
    _make_parent(path.parent, private)
    mode = PRIVATE_FILE_MODE if private else FILE_MODE
    tmp = _temp_path(path, "tmp")
    # Reserve the name with the final mode first, so a private file is never readable by others.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode))
    try:
        yield tmp
        os.chmod(tmp, mode)  # the writer may have recreated the file, and the umask masks os.open's mode
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike, data: str | bytes, *, private: bool = False) -> Path:
    """Replace ``path`` with ``data`` (str is written as UTF-8) atomically and durably; returns the path."""
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    path = Path(path)
    with atomic_output(path, private=private) as tmp, open(tmp, "wb") as file:
        file.write(payload)
    return path


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh staging folder next to ``target``; on normal exit rename it onto ``target``.

    If ``target`` exists by then (another process finished first), the staging folder is discarded and
    the existing ``target`` kept. On an exception the staging folder is removed.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _temp_path(target, "staging")
    staging.mkdir()
    try:
        yield staging
        for root, _, files in os.walk(staging):
            for name in files:
                _fsync_file(Path(root) / name)
            _fsync_dir(Path(root))
        if not target.exists():
            try:
                os.rename(staging, target)
            except OSError:
                if not target.exists():
                    raise  # a real failure, not a lost race
            else:
                _fsync_dir(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
