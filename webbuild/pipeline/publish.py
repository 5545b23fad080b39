"""Putting a finished output folder (a site, `webbuild fuse`'s graphs) in place of the old one.

At every instant the output folder is the old complete one or the new complete one:

- the new folder is made beside the output (`staging`, a temporary folder on the same file system), so
  that it can be renamed into place;
- the two folders trade places in one system call: `renameat2(RENAME_EXCHANGE)` on Linux,
  `renamex_np(RENAME_SWAP)` on macOS; a first build is one plain rename;
- where no exchange exists (another OS, a file system without it) the output is a symbolic link to the
  site, a folder beside it (`.NAME-site-ID`), and a new site is published by renaming a new link over it,
  one atomic rename too. A first build there makes the link; an output that is a real folder becomes a link
  by two renames (the folder aside as `.NAME-old-PID`, then the link in), the one moment without an
  output, and the next run of `output_lock` puts the folder back if the process was killed in between;
- files the user put into the output (CNAME, .nojekyll, robots.txt: anything the last run did not
  write) are copied into the new folder before the exchange, so they survive a rebuild;
- `output_lock` holds an exclusive lock beside the output for the whole run: a second run into the same
  folder stops with one line instead of racing this one, and what killed runs left (which only a lock
  holder can tell apart from a live run's) is removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from webbuild.errors import BuildError, WebbuildError

log = logging.getLogger(__name__)

# the exchange's flag: RENAME_EXCHANGE in linux/fs.h, RENAME_SWAP in macOS's stdio.h
_EXCHANGE = {"linux": ("renameat2", 2), "darwin": ("renamex_np", 2)}
# errors of a system or file system without the exchange (overlay and FUSE file systems answer EXDEV)
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}


# what an existing output that is no folder is, by its stat mode (a build must never replace a device or a FIFO)
_KINDS = {stat.S_ISREG: "a file", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device",
          stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}


def output_problem(output: Path) -> str | None:
    """Why `output` (resolved) cannot be a replaced-whole output folder, checked before any work: a thing that
    is no folder (a file, /dev/null, a FIFO: a build replaced the device node once, and hung on a FIFO), or a
    mount point (a container volume: no rename can move it, the exchange answers EBUSY). None: it can be."""
    try:
        mode = os.stat(output).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None  # new (a file in its path is output_lock's one line)
    if not stat.S_ISDIR(mode):
        kind = next((name for test, name in _KINDS.items() if test(mode)), "not a folder")
        return f"{output} is {kind}, and the output must be a folder (it is replaced whole); choose a folder with -o"
    if os.path.ismount(output):
        return (f"{output} is a mount point, which cannot be replaced in one step as the output folder is; "
                f"write into a folder inside it (-o {output / 'site'}) or choose another folder with -o")
    return None


def step(name: str) -> None:
    """Called before each step of `publish`: a no-op, where the tests kill the process to prove that every
    step leaves a complete output behind."""


def staging_prefix(output: Path) -> str:
    return f".{output.name}-build-"


def _old_prefix(output: Path) -> str:
    return f".{output.name}-old-"


def _site_prefix(output: Path) -> str:
    """The sites an output that is a link points at, where there is no exchange."""
    return f".{output.name}-site-"


def _link_prefix(output: Path) -> str:
    return f".{output.name}-link-"


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
    if aside and not output.exists():  # killed between the two renames that make a folder a link
        aside[-1].rename(output)
        log.warning(f"{output}: put back the previous output, left aside by a run that was killed")
    live = _our_site(output)
    for stale in [*output.parent.glob(_old_prefix(output) + "*"), *output.parent.glob(staging_prefix(output) + "*"),
                  *output.parent.glob(_link_prefix(output) + "*"), *output.parent.glob(_site_prefix(output) + "*")]:
        if stale != live:
            log.info(f"removing {stale.name}, left by a run that was killed")
            _remove(stale)


def _our_site(output: Path) -> Path | None:
    """The `.NAME-site-ID` folder the output links to, if it is one (a link of the user's is not ours)."""
    if not output.is_symlink():
        return None
    target = output.parent / os.readlink(output)
    return target if target.parent == output.parent and target.name.startswith(_site_prefix(output)) else None


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
    exists = output.exists() or output.is_symlink()
    if not exists and _exchange_works(built.parent):
        step("rename")
        built.rename(output)
        return
    step("exchange")
    linked = _our_site(output)  # an output that was a link: its site goes too
    if exists and _exchange(built, output):
        step("remove old")
        _remove(built)  # the old output now
        if linked is not None:
            _remove(linked)
        return
    _publish_by_link(built, output)


def _publish_by_link(built: Path, output: Path) -> None:
    """Without an exchange: the new site beside the output, and a link to it renamed over the output (a
    link: one atomic rename; a real folder: aside first, `_recover` puts it back if killed there)."""
    old = _our_site(output)
    site = output.with_name(f"{_site_prefix(output)}{secrets.token_hex(4)}")
    step("site")
    built.rename(site)
    link = output.with_name(f"{_link_prefix(output)}{os.getpid()}")
    step("link")
    link.symlink_to(site.name)  # relative: the output and its site move together
    if output.is_dir() and not output.is_symlink():
        aside = output.with_name(f"{_old_prefix(output)}{os.getpid()}")
        step("aside")
        output.rename(aside)
        old = aside
    step("flip")
    os.replace(link, output)
    if old is not None:
        step("remove old")
        _remove(old)


def _remove(path: Path) -> None:
    """The old output: a folder, or a symbolic link (its target, when the user's, is kept)."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path)


def _exchange_call() -> Callable[..., int] | None:
    """This system's exchange of two paths (the C library's function), or None."""
    name, _ = _EXCHANGE.get(sys.platform, ("", 0))
    if not name:
        return None
    call = getattr(ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True), name, None)
    if call is not None:
        call.restype = ctypes.c_int
    return call


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one system call; False where the system or the file system cannot."""
    call = _exchange_call()
    if call is None:
        return False
    _, flag = _EXCHANGE[sys.platform]
    at_fdcwd = -100
    src, dst, flags = os.fsencode(a), os.fsencode(b), ctypes.c_uint(flag)
    if (call(at_fdcwd, src, at_fdcwd, dst, flags) if sys.platform == "linux" else call(src, dst, flags)) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    if err == errno.EBUSY:  # a mount point that output_problem could not tell (a bind mount of the same device)
        raise BuildError(f"{b}: {os.strerror(err)}: it is a mount point or in use, and the output folder is "
                         "replaced whole; write into a folder inside it or choose another folder with -o")
    raise OSError(err, os.strerror(err), str(b))


def _exchange_works(folder: Path) -> bool:
    """Whether two folders in `folder` trade places here: tried on two empty ones (a first build, with no
    output to exchange yet, makes the link where the next build could not exchange)."""
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        a, b = Path(tmp, "a"), Path(tmp, "b")
        a.mkdir()
        b.mkdir()
        return _exchange(a, b)


def user_files(output: Path, written: Iterable[str]) -> list[str]:
    """Files under `output` (relative paths) that are not among `written`, what the last run wrote there."""
    if not output.is_dir():
        return []
    ours = set(written)
    return sorted(name for p in output.rglob("*") if p.is_file() and (name := p.relative_to(output).as_posix())
                  not in ours)
