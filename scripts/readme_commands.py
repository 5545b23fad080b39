"""Run the commands of README.md's sh blocks, in order, as written, from a clone's root.

usage: python scripts/readme_commands.py [--root DIR] [--list] [README]

The README's convention (its top says so): every line of a ```sh block runs from the root of a fresh clone
(`make site`, the first command, sets up .venv), in a shell with .venv/bin first on its PATH, as after
`source .venv/bin/activate`. A line whose comment ends with `needs: WHAT` needs more than that (torch,
verify, apt, pipx, aws, ...) and is skipped, naming WHAT; a line whose comment says `(Ctrl-C stops)` is a
server: it must still be running after SERVER_SECONDS, and is then stopped with SIGINT. A line fails when it
exits non-zero; the run goes on and exits 1 if any failed. `--list` prints what would run and what is
skipped, running nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NEEDS = re.compile(r"#.*\bneeds: ([^#]+?)\s*$")
SERVER = "(Ctrl-C stops)"
SERVER_SECONDS = 8
TIMEOUT = 900  # seconds per command: `make site` on a slow network


@dataclass(frozen=True)
class Command:
    line: str
    needs: str | None  # what it needs beyond a fresh clone after `make site`, or None: it runs
    server: bool


def commands(readme: str) -> list[Command]:
    """Every command line of the ```sh blocks, in order."""
    out = []
    for block in re.findall(r"^```sh\n(.*?)^```", readme, re.S | re.M):
        for line in block.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                needs = NEEDS.search(line)
                out.append(Command(line.strip(), needs[1] if needs else None, SERVER in line))
    return out


def shell_env(root: Path) -> dict[str, str]:
    venv = root / ".venv"
    return {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(venv)}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(command: Command, root: Path) -> str | None:
    """Why `command` failed, or None."""
    if command.server:
        # SIGINT at its default in the server: a shell that started this run in the background (`cmd &`, nohup)
        # leaves it ignored, and Python then installs no KeyboardInterrupt, so Ctrl-C would not stop the server
        proc = subprocess.Popen(["bash", "-c", command.line], cwd=root, env=shell_env(root),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=_default_sigint)
        time.sleep(SERVER_SECONDS)
        if proc.poll() is not None:
            return f"exited {proc.returncode} within {SERVER_SECONDS} s: {proc.communicate()[0][-1500:]}"
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)
        return None
    r = subprocess.run(["bash", "-c", command.line], cwd=root, env=shell_env(root), capture_output=True, text=True,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    return None if r.returncode == 0 else f"exit code {r.returncode}: {(r.stderr or r.stdout)[-1500:]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("readme", nargs="?", type=Path, default=Path("README.md"))
    ap.add_argument("--root", type=Path, default=Path("."), help="the clone the commands run in (default: .)")
    ap.add_argument("--list", action="store_true", help="print the commands and the skipped lines; run nothing")
    args = ap.parse_args(argv)
    failed = 0
    for command in commands(args.readme.read_text()):
        if command.needs:
            print(f"skip (needs {command.needs}): {command.line}", flush=True)
            continue
        if args.list:
            print(f"run: {command.line}", flush=True)
            continue
        start = time.monotonic()
        why = run(command, args.root.resolve())
        print(f"{'FAIL' if why else 'ok'} {time.monotonic() - start:6.1f}s: {command.line}", flush=True)
        if why:
            failed += 1
            print("    " + why.strip().replace("\n", "\n    "), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
