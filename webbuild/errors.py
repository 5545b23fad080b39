"""The errors a user can fix: bad input, reported as `error: ...` lines on stderr with exit code 2.

Only WebbuildError and its subclasses mean bad input; click shows them (they are ClickExceptions) when a
command raises one. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import click


class WebbuildError(click.ClickException):
    """Bad input; the message names the file or setting and says how to fix it."""

    exit_code = 2

    def lines(self) -> list[str]:
        return [self.format_message()]

    def show(self, file=None) -> None:
        for line in self.lines():
            click.echo(f"error: {line}", file=file, err=file is None)


class ConfigError(WebbuildError):
    """An invalid model.yaml; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems

    def lines(self) -> list[str]:
        return self.problems


class CommandError(WebbuildError):
    """A command line that names no command (`webbuild servee dist`)."""


class SourceError(WebbuildError):
    """A model given as input (source export, checkpoint, built site) lacks what the command needs."""


class AudioError(WebbuildError):
    """An audio file that cannot be read as speech."""


class FusionIncomplete(WebbuildError):
    """`webbuild fuse --strict` or `fusion.strict`: an attention or a norm was left decomposed. A check that
    failed rather than bad input: exit code 1."""

    exit_code = 1


class CheckFailed(WebbuildError):
    """A build whose samples' WER is above verify.max_wer with --fail-on-wer: a check that failed, exit code 1."""

    exit_code = 1


class BuildError(WebbuildError):
    """A build stage cannot make the site from this input (assemble, quantize, shard, render, wasm twins)."""


class ZooError(WebbuildError):
    """`webbuild zoo` cannot make the export asked for."""


class ServeError(WebbuildError):
    """`webbuild serve` cannot serve the folder."""


class BrowserError(WebbuildError):
    """No usable browser for `webbuild verify` / `webbuild bench --runtime browser`."""


class VerifyInputError(WebbuildError):
    """Bad arguments to `webbuild verify` (missing folder, clips without transcripts, ...)."""


class BenchError(WebbuildError):
    """A bench that could not run; the message says why."""


class InitError(WebbuildError):
    """`webbuild init` cannot write a model.yaml for this folder (not an export, a file there already, ...)."""


class ExtraError(WebbuildError):
    """A command whose optional dependencies (a pip extra of pyproject.toml) are not installed."""


def require_extra(extra: str, what: str, *modules: str) -> None:
    """Raise ExtraError naming the extra when one of `modules` is not installed.

    The main install (`make site`, `pip install -e .`) leaves torch out: only the zoo and training need it,
    and it is most of the venv. find_spec looks the modules up without importing them.
    """
    import importlib.util

    def installed(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ImportError:  # a meta-path finder that refuses the name (how the tests hide torch)
            return False

    missing = [m for m in modules if not installed(m)]
    if missing:
        raise ExtraError(f"{what} needs {' and '.join(missing)}, which the main install leaves out: "
                         f"pip install -e '.[{extra}]' (README.md, Install, says how to get torch's CPU build)")
