"""Publishing an output folder (webbuild.pipeline.publish): a process killed at any step leaves the old
complete site or the new complete one; a second build into the same folder stops with one line; the
user's files in the output survive a rebuild; folders of killed runs are removed by the next one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.command import webbuild
from tests.example_config import EXAMPLE, REPO, write_example_config
from tests.inputs import invoke
from webbuild.pipeline import publish as pub
from webbuild.site.manifest import verify_manifest

USER = {"CNAME": "asr.example.org\n", ".nojekyll": "", "robots.txt": "User-agent: *\n"}
# every step of each way to publish, and None: not killed
# (without an exchange: "to link" makes a real folder a link, "link" flips a link)
STEPS = {"exchange": ["keep", "exchange", "remove old", None],
         "to link": ["keep", "exchange", "site", "link", "aside", "flip", "remove old", None],
         "link": ["keep", "exchange", "site", "link", "flip", "remove old", None]}
NO_EXCHANGE = ("to link", "link")


def _tree(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _site(example_dist: Path, dest: Path, marker: str) -> dict[str, int]:
    """A copy of the built example (hard links: publish never writes into a file) told apart by `marker`."""
    shutil.copytree(example_dist, dest, copy_function=os.link)
    report = dest / "build-report.json"
    data = json.loads(report.read_text()) | {"name": marker}
    report.unlink()
    report.write_text(json.dumps(data))
    return _tree(dest)


def _publish_killed_at(step: str | None, built: Path, out: Path, keep: list[str], exchange: bool) -> int:
    """publish() in a child process that SIGKILLs itself when it reaches `step`; the child's wait status."""
    pid = os.fork()
    if pid == 0:  # the child: no cleanup of any kind runs after the kill, as with a real one
        try:
            if not exchange:
                pub._exchange = lambda a, b: False
            pub.step = lambda name: os.kill(os.getpid(), signal.SIGKILL) if name == step else None
            pub.publish(built, out, keep)
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


def _no_exchange(monkeypatch) -> None:
    monkeypatch.setattr(pub, "_exchange", lambda a, b: False)


def _old_site(example_dist: Path, out: Path, mode: str) -> dict[str, int]:
    """The output before the publish: a folder, or (mode "link") a link to a site published without an
    exchange."""
    if mode != "link":
        return _site(example_dist, out, "old")
    built = out.with_name("first")
    tree = _site(example_dist, built, "old")
    pub._publish_by_link(built, out)
    assert out.is_symlink() and pub._our_site(out) is not None
    return tree


@pytest.mark.parametrize("mode", STEPS)
def test_a_kill_at_every_publish_step_leaves_a_complete_site(example_dist, tmp_path, mode):
    for step in STEPS[mode]:
        case = tmp_path / f"{mode}-{step}"
        out, built = case / "dist", case / f"{pub.staging_prefix(case / 'dist')}x" / "site"
        old = _old_site(example_dist, out, mode)
        for name, text in USER.items():
            (out / name).write_text(text)
        new = _site(example_dist, built, "new") | {name: len(text) for name, text in USER.items()}
        status = _publish_killed_at(step, built, out, list(USER), exchange=mode not in NO_EXCHANGE)
        assert os.WIFSIGNALED(status) == (step is not None), (step, status)
        with pub.output_lock(out):  # the next run: puts an output left aside back, removes what is stale
            pass
        which = json.loads((out / "build-report.json").read_text())["name"]
        expected = {"new": new, "old": {**old, **{n: len(t) for n, t in USER.items()}}}[which]
        assert _tree(out) == expected, (mode, step)
        assert which == ("old" if step in ("keep", "exchange", "site", "link", "aside", "flip") else "new"), \
            (mode, step)
        assert verify_manifest(out / "model") == []
        site = pub._our_site(out)  # no stale folder, no lock file: the output and the site it links to
        assert sorted(p.name for p in case.iterdir()) == sorted(["dist", *([site.name] if site else [])]), (mode, step)
        assert out.is_symlink() == (mode == "link" or (mode == "to link" and which == "new")), (mode, step)


def test_without_an_exchange_a_first_build_makes_a_link_and_the_next_flips_it(example_dist, tmp_path,
                                                                              monkeypatch):
    """Never a moment without an output: the first publish is the site and a link to it, every later one a new
    site and a link renamed over the old; the old site goes, the user's files stay."""
    _no_exchange(monkeypatch)
    out = tmp_path / "dist"
    for n in range(3):
        built = tmp_path / f"{pub.staging_prefix(out)}{n}"
        tree = _site(example_dist, built, f"site {n}")
        pub.publish(built, out, pub.user_files(out, tree))
        (out / "CNAME").write_text("asr.example.org\n")
        assert out.is_symlink() and json.loads((out / "build-report.json").read_text())["name"] == f"site {n}"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["dist", pub._our_site(out).name])
    assert (out / "CNAME").read_text() == "asr.example.org\n"


@pytest.mark.parametrize("exchange", [True, False])
def test_a_link_of_the_users_is_replaced_and_its_folder_kept(example_dist, tmp_path, monkeypatch, exchange):
    mine, out, built = tmp_path / "mine", tmp_path / "dist", tmp_path / "new"
    _site(example_dist, mine, "mine")
    out.symlink_to(mine)
    if not exchange:
        _no_exchange(monkeypatch)
    _site(example_dist, built, "new")
    with pub.output_lock(out):
        pub.publish(built, out)
    assert json.loads((mine / "build-report.json").read_text())["name"] == "mine"
    assert json.loads((out / "build-report.json").read_text())["name"] == "new"
    assert out.is_symlink() == (not exchange)


def test_the_exchange_is_one_system_call_here(tmp_path):
    """Linux with renameat2 (glibc >= 2.28) on this file system: the path the tests above call 'exchange'."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    assert pub._exchange(a, b) and (b / "x").read_text() == "a" and not (a / "x").exists()


def test_a_second_build_into_the_same_folder_stops_with_one_line_and_user_files_survive(example_dist, tmp_path,
                                                                                       tmp_path_factory):
    """The README's Pages recipe after two builds: CNAME and .nojekyll added to dist/ stay; a build started
    while another writes the same folder exits 2 with one line, and the first ends with a complete site."""
    out = tmp_path / "dist"
    shutil.copytree(example_dist, out)
    for name, text in USER.items():
        (out / name).write_text(text)
    config = write_example_config(tmp_path_factory.mktemp("config"), adapters=[])  # no adapter: seconds fewer
    command = [sys.executable, "-m", "webbuild.cli", str(config), "-o", str(out)]
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".dist.lock"
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text()) and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
    assert second.stderr.strip().splitlines()[-1] == (
        f"error: {out} is being written by another webbuild run (pid {first.pid}); wait for it to finish, "
        "or write elsewhere with -o")
    assert verify_manifest(out / "model") == []
    assert {name: (out / name).read_text() for name in USER} == USER
    written = json.loads((out / "build-report.json").read_text())["files"]["written"]
    assert not set(USER) & set(written) and "index.html" in written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist"]


def test_folders_of_killed_builds_are_removed_by_the_next_run(tmp_path):
    out = tmp_path / "dist"
    stale = [tmp_path / f"{pub.staging_prefix(out)}123abc", tmp_path / ".dist-old-77"]
    for folder in stale:
        (folder / "site").mkdir(parents=True)
    (tmp_path / ".dist-other").mkdir()  # not ours: stays
    with pub.output_lock(out):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [".dist-other", "dist"]  # the aside one put back


def test_site_static_files_are_copied_into_a_new_output(tmp_path):
    """A CI job builds into a new folder every time: model.yaml site.static brings CNAME and .nojekyll."""
    from tests.example_config import write_example_config

    static = tmp_path / "static"
    (static / ".well-known").mkdir(parents=True)
    for name, text in {"CNAME": "asr.example.org\n", ".nojekyll": "", ".well-known/x.txt": "x"}.items():
        (static / name).write_text(text)
    cfg = yaml.safe_load(write_example_config(tmp_path).read_text())
    cfg["site"] |= {"static": str(static), "samples": cfg["site"]["samples"][:1]}
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(cfg | {"adapters": [], "variants": ["fp32"]}))
    run = invoke(tmp_path / "model.yaml", "-o", tmp_path / "out")
    assert run.code == 0, (run.stderr, run.exception)
    written = json.loads((tmp_path / "out" / "build-report.json").read_text())["files"]["written"]
    assert {"CNAME", ".nojekyll", ".well-known/x.txt"} <= set(written)
    assert (tmp_path / "out" / "CNAME").read_text() == "asr.example.org\n"


@pytest.mark.parametrize("static", ["missing", "model.yaml"])
def test_a_site_static_that_is_no_folder_is_one_line(tmp_path, static):
    from tests.example_config import write_example_config

    cfg = yaml.safe_load(write_example_config(tmp_path).read_text())
    cfg["site"]["static"] = str(tmp_path / static)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(cfg))
    run = invoke(tmp_path / "model.yaml", "-o", tmp_path / "out")
    what = "does not exist" if static == "missing" else "is a file, not a folder"
    assert run.code == 2 and f"site.static: {tmp_path / static} {what}; point it at a folder" in run.stderr
    assert run.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_static_file_may_not_replace_one_the_build_writes(tmp_path):
    from webbuild.errors import BuildError
    from webbuild.pipeline.render import copy_static

    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "index.html").write_text("mine")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("the build's")
    with pytest.raises(BuildError, match=r"site.static: .*static/index.html has the name of a file the build "
                                         r"writes \(index.html\); rename or remove it"):
        copy_static(tmp_path / "static", tmp_path / "site")
    assert (tmp_path / "site" / "index.html").read_text() == "the build's"


def test_an_output_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "dist"
    line = invoke(EXAMPLE / "model.yaml", "-o", out).error_line()
    assert line == f"error: {out}: cannot write beside it (a file is in its path); write elsewhere with -o"


def test_errors_while_making_name_the_output_not_the_staging_folder(tmp_path):
    from webbuild.errors import BuildError, SourceError

    out, tmp = tmp_path / "dist", tmp_path / ".dist-build-x"
    with pytest.raises(BuildError) as exc, pub.making(out, tmp):
        raise SourceError(f"{tmp}/site/model/manifest.json: bad; {tmp}/work/fused/encoder.onnx: worse")
    assert exc.value.format_message() == f"{out}/model/manifest.json: bad; fused/encoder.onnx: worse"
    with pytest.raises(BuildError, match=f"cannot write the new {out}: No space left on device; free disk"), \
            pub.making(out, tmp):
        raise OSError(28, "No space left on device", str(tmp / "work" / "x"))


def _no_folder(path: Path, kind: str) -> None:
    """`path` made as an output that is no folder: a file, a FIFO, or a character device (a node of /dev/null's
    numbers made here, never /dev/null itself: before the check a build replaced the node it was given)."""
    if kind == "a file":
        path.write_text("mine\n")
    elif kind == "a FIFO":
        os.mkfifo(path)
    else:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a character device needs root (CAP_MKNOD)")


@pytest.mark.parametrize("kind", ["a file", "a FIFO", "a character device"])
@pytest.mark.parametrize("command", ["build", "fuse"])
def test_an_output_that_is_no_folder_is_one_line_before_any_work(tmp_path, kind, command):
    """-o /dev/null replaced the device node with the site, -o a FIFO hung the build: any output that exists and
    is no folder is one line (exit code 2) before anything is made, and stays as it was."""
    out = tmp_path / "out"
    _no_folder(out, kind)
    before = os.lstat(out)
    args = [EXAMPLE / "model.yaml", "-o", out] if command == "build" else ["fuse", EXAMPLE / "model", "-o", out]
    r = webbuild(*args, timeout=120)  # a hang is a TimeoutExpired
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        f"error: {out} is {kind}, and the output must be a folder (it is replaced whole); choose a folder with -o"])
    after = os.lstat(out)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock, no staging folder


@contextlib.contextmanager
def _mounted(folder: Path, *how: str):
    """`folder` as a mount point (`mount ... how folder`), unmounted on the way out; a skip where this machine
    lets no one mount (not root, or a container without CAP_SYS_ADMIN)."""
    folder.mkdir(exist_ok=True)
    r = subprocess.run(["mount", *how, str(folder)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount here ({r.stderr.strip() or r.returncode}): the mount-point output is untested")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("command", ["build", "fuse"])
def test_a_mount_point_output_is_one_line_before_any_work(tmp_path, command):
    """A container volume given as -o was an `OSError: [Errno 16] Device or resource busy` traceback at the
    end of the build (no rename moves a mount point): one line before the build, naming a folder inside it."""
    with _mounted(tmp_path / "out", "-t", "tmpfs", "-o", "size=4m", "tmpfs") as out:
        args = [EXAMPLE / "model.yaml", "-o", out] if command == "build" else ["fuse", EXAMPLE / "model", "-o", out]
        r = webbuild(*args, timeout=300)
        assert (r.returncode, r.stderr.splitlines()) == (2, [
            f"error: {out} is a mount point, which cannot be replaced in one step as the output folder is; write "
            f"into a folder inside it (-o {out / 'site'}) or choose another folder with -o"])
        assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_exchange_refused_as_busy_is_one_line(tmp_path):
    """A bind mount of a folder of the same file system is no mount point to os.path.ismount (same device);
    the exchange answers EBUSY: one line, the built folder and the mount kept."""
    from webbuild.errors import BuildError

    (tmp_path / "built").mkdir()
    (tmp_path / "built" / "index.html").write_text("new")
    (tmp_path / "out").mkdir()
    with _mounted(tmp_path / "out", "--bind", str(tmp_path / "out")) as out:
        assert not os.path.ismount(out)
        with pytest.raises(BuildError, match=rf"^{out}: Device or resource busy: it is a mount point or in use"):
            pub.publish(tmp_path / "built", out)
        assert (tmp_path / "built" / "index.html").read_text() == "new"
