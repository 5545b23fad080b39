"""Putting a finished output folder (a site, `webbuild fuse`'s graphs) in place of the old one.

At every instant the output folder is the old complete one or the new complete one:

- the new folder is made beside the output (`staging`, a temporary folder on the same file system), so
  that it can be renamed into place;
- on Linux the two folders trade places in one `renameat2(RENAME_EXCHANGE)` call; a first build is one
  plain rename. Where the exchange is missing (another OS, a file system without it) the old folder is
  renamed aside first (`.NAME-old-PID`) and the new one into place; a process killed between the two
  leaves no output for that moment, and the next run of `output_lock` puts the old folder back;
- files the user put into the output (CNAME, .nojekyll, robots.txt: anything the last run did not
  write) are copied into the new folder before the exchange, so they survive a rebuild;
- `output_lock` holds an exclusive lock beside the output for the whole run: a second run into the same
  folder stops with one line instead of racing this one, and folders left by killed runs (which only a
  lock holder can tell apart from live ones) are removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from webbuild.errors import BuildError, WebbuildError

log = logging.getLogger(__name__)

_RENAME_EXCHANGE = 2  # linux/fs.h


def step(name: str) -> None:
    """Called before each step of `publish`: a no-op, where the tests kill the process to prove that every
    step leaves a complete output behind."""


def staging_prefix(output: Path) -> str:
    return f".{output.name}-build-"


def _old_prefix(output: Path) -> str:
    return f".{output.name}-old-"


def _lock_path(output: Path) -> Path:
    return output.with_name(f".{output.name}.lock")


@contextlib.contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold the output's lock (a BuildError when another run holds it), after putting back an output a
    killed fallback publish left aside and removing the folders killed runs left. The lock file is removed
    on the way out, so none stays beside the output."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(_lock_path(output), os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as exc:  # -o in a folder the user cannot write, or below a file
        why = "a file is in its path" if isinstance(exc, FileExistsError | NotADirectoryError) else exc.strerror
        raise BuildError(f"{output}: cannot write beside it ({why}); write elsewhere with -o") from None
    with _locked(_lock_path(output), output) as fd:
        try:
            _recover(output)
            yield
        finally:
            os.unlink(_lock_path(output))  # while still locked: a run that opened it before retries (`_locked`)
            os.close(fd)


@contextlib.contextmanager
def _locked(path: Path, output: Path) -> Iterator[int]:
    """An exclusive flock on `path`, a file that is still the one at `path` once locked (another run may have
    removed it meanwhile: then again, on the new one)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 100).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise BuildError(f"{output} is being written by another webbuild run ({holder}); wait for it to "
                             "finish, or write elsewhere with -o") from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}".encode())
    yield fd


def _recover(output: Path) -> None:
    """Under the lock no other run is live: what a killed one left beside the output is stale."""
    aside = sorted(output.parent.glob(_old_prefix(output) + "*"))
    if aside and not output.exists():  # killed between the fallback's two renames
        aside[-1].rename(output)
        log.warning(f"{output}: put back the previous output, left aside by a run that was killed")
    for stale in [*output.parent.glob(_old_prefix(output) + "*"), *output.parent.glob(staging_prefix(output) + "*")]:
        log.info(f"removing {stale.name}, left by a run that was killed")
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def staging(output: Path) -> Iterator[Path]:
    """A new empty folder beside `output`, removed on the way out (whatever stayed in it)."""
    with tempfile.TemporaryDirectory(prefix=staging_prefix(output), dir=output.parent) as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def making(output: Path, tmp: Path) -> Iterator[None]:
    """Errors while the new output is made in `tmp`: they name the output, never the staging folder (a
    user's error message names the user's files), and a full disk is one line, not an OSError."""
    try:
        yield
    except WebbuildError as exc:
        text = exc.format_message()
        clean = text.replace(f"{tmp}/site", str(output)).replace(f"{tmp}/work/", "").replace(f"{tmp}/out", str(output))
        if clean == text:
            raise
        error = BuildError(clean)
        error.exit_code = exc.exit_code  # type: ignore[misc]  # as the runner's stage errors
        raise error from exc
    except OSError as exc:
        # ENOSPC, EDQUOT, EFBIG (a file size limit), or a library's write error without an errno (onnx's
        # "problem writing element"); an OSError on the user's own files keeps its traceback
        inside = str(tmp) in f"{exc.filename}" or exc.errno is None
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or inside:
            raise BuildError(f"cannot write the new {output}: {exc.strerror or exc}; free disk space on its file "
                             "system or write elsewhere with -o") from None
        raise


def publish(built: Path, output: Path, keep: Iterable[str] = ()) -> None:
    """Put folder `built` in place of `output`, after copying the files `keep` (paths relative to the
    output) from the old output into it. `built` and `output` must be on one file system."""
    step("keep")
    for name in keep:
        src, dest = output / name, built / name
        if src.is_file() and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
    if not output.exists():
        step("rename")
        built.rename(output)
        return
    step("exchange")
    if _exchange(built, output):
        step("remove old")
        _remove(built)  # the old output now
        return
    _swap_by_renames(built, output)


def _swap_by_renames(built: Path, output: Path) -> None:
    """The fallback: the old output aside (`_recover` puts it back if killed here), the new one in."""
    aside = output.with_name(f"{_old_prefix(output)}{os.getpid()}")
    step("aside")
    output.rename(aside)
    step("rename")
    built.rename(output)
    step("remove old")
    _remove(aside)


def _remove(path: Path) -> None:
    """The old output: a folder, or the symbolic link the output was (its target is the user's: kept)."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path)


def _renameat2() -> Callable[..., int] | None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return getattr(libc, "renameat2", None)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one system call; False where the system or the file system cannot."""
    call = _renameat2()
    if call is None:
        return False
    at_fdcwd = -100
    if call(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def user_files(output: Path, written: Iterable[str]) -> list[str]:
    """Files under `output` (relative paths) that are not among `written`, what the last run wrote there."""
    if not output.is_dir():
        return []
    ours = set(written)
    return sorted(name for p in output.rglob("*") if p.is_file() and (name := p.relative_to(output).as_posix())
                  not in ours)
