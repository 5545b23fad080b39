"""Write held-out clips as WAV + same-named .txt transcripts (the layout `webbuild transcribe` and
`webbuild verify --clips` read).

    python -m webbuild.train.clips OUT_DIR [--count 500] [--target klatt]

The clips are exactly the held-out clips the training run evaluates on: same sentences, same
voices, rates, pitches and noise (synthesis is seeded per shard). With `--target`, the held-out clips
of an adapter's target (webbuild.train.target) instead, as `adapt evaluate` scores them.
"""

from __future__ import annotations

from pathlib import Path

import click

from webbuild.reference.audio import write_wav
from webbuild.text import plural
from webbuild.train.dataset import synthesize_sharded
from webbuild.train.sentences import HELDOUT_SEED, HELDOUT_SIZE, heldout_sentences, load_vocabulary


def write_heldout_clips(out_dir: Path, count: int = HELDOUT_SIZE, target: str | None = None) -> list[Path]:
    if target is None:
        clips = synthesize_sharded(heldout_sentences(load_vocabulary()), HELDOUT_SEED)
    else:
        from webbuild.train.target import heldout_target

        clips = heldout_target(target, count)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(min(count, len(clips.texts))):
        wav = out_dir / f"heldout-{i:03d}.wav"
        write_wav(wav, clips.clip(i))
        wav.with_suffix(".txt").write_text(clips.texts[i] + "\n")
        paths.append(wav)
    return paths


@click.command()
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--count", default=HELDOUT_SIZE, show_default=True, help="how many held-out clips to write")
@click.option("--target", default=None, help="an adapter target's held-out clips (webbuild.train.target), e.g. klatt")
def main(out_dir: Path, count: int, target: str | None):
    """Write the held-out clips into OUT_DIR as heldout-NNN.wav + heldout-NNN.txt."""
    paths = write_heldout_clips(out_dir, count, target)
    click.echo(f"wrote {plural(len(paths), 'clip')} to {out_dir}")


if __name__ == "__main__":
    main()
