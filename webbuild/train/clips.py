"""Write held-out clips as WAV + same-named .txt transcripts (the layout `webbuild transcribe` and
`webbuild verify --clips` read).

    python -m webbuild.train.clips OUT_DIR [--count 500] [--language English] [--fresh SEED] [--target klatt]
                                           [--rates 16000,22050,44100x2,48000] [--joined long.wav]

The clips are exactly the held-out clips the training run evaluates on: same sentences, same
voices, rates, pitches and noise (synthesis is seeded per shard), of `--language` (one of
webbuild.train.languages; English by default: the English-only model's held-out set). `--fresh SEED`: new
sentences instead, drawn with SEED from the language's published vocabulary (webbuild/train/vocabulary/), none
of its held-out set, spoken in its voices in the held-out styles: clips no training run evaluated on (a run's
own draws use its seed, 1 for the example, and the tokenizer's 0; give another). With `--target`, the held-out
clips of an adapter's target (webbuild.train.target) instead, as `adapt evaluate` scores them.

`--rates` writes clip i at the i-th rate of the list, round robin (`x2`: stereo): the clip's 16 kHz audio
brought up to that rate by the project's resampler, plus full-band white noise at -66 dB (the band above
8 kHz a microphone records, which resampling to 16 kHz must filter out; stereo: a second channel at 0.8
times the first with its own noise), as 16-bit PCM. `--joined` also writes every clip, one after
another at 16 kHz, into one WAV with its transcript beside it (long-audio checks).
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from webbuild.errors import require_extra
from webbuild.reference.audio import write_wav
from webbuild.reference.resample import resample
from webbuild.text import plural
from webbuild.train.dataset import Clips, synthesize_sharded
from webbuild.train.languages import ENGLISH, LANGUAGES, Language
from webbuild.train.sentences import HELDOUT_SEED, HELDOUT_SIZE, language_heldout, load_vocabulary, training_sentences

NOISE = 5e-4  # -66 dB full scale


def parse_rates(text: str) -> list[tuple[int, int]]:
    """'16000,44100x2' -> [(16000, 1), (44100, 2)]: rates and channel counts."""
    out = []
    for item in text.split(","):
        rate, _, channels = item.strip().partition("x")
        out.append((int(rate), int(channels or 1)))
    return out


def at_rate(pcm: np.ndarray, rate: int, channels: int, seed: int) -> np.ndarray:
    """A 16 kHz clip at `rate` with full-band noise, [n, channels]."""
    rng = np.random.default_rng(seed)
    up = resample(pcm.astype(np.float64), 16000, rate)
    chans = [up * (1.0 if c == 0 else 0.8) + NOISE * rng.standard_normal(len(up)) for c in range(channels)]
    return np.stack(chans, axis=1)


def language_clips(lang: Language, count: int, fresh: int | None = None) -> Clips:
    """`lang`'s held-out clips (the first `count`: each clip's audio depends on those before it in its shard,
    so they are synthesized all, as the training run does), or with `fresh` `count` new ones: sentences drawn
    with that seed (plus the language's offset) outside its held-out set, spoken in the held-out styles."""
    seed = HELDOUT_SEED + lang.seed_offset
    if fresh is None:
        texts = language_heldout(lang)
    else:
        seed = fresh + lang.seed_offset
        texts = training_sentences(load_vocabulary(lang.vocabulary), count, seed, HELDOUT_SEED + lang.seed_offset)
    return synthesize_sharded(texts, seed, languages=[lang.name] * len(texts))


def write_heldout_clips(out_dir: Path, count: int = HELDOUT_SIZE, target: str | None = None,
                        rates: list[tuple[int, int]] | None = None, joined: Path | None = None,
                        language: Language = ENGLISH, fresh: int | None = None) -> list[Path]:
    if target is None:
        clips = language_clips(language, count, fresh)
    else:
        from webbuild.train.target import heldout_target

        clips = heldout_target(target, count)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(min(count, len(clips.texts))):
        wav = out_dir / f"heldout-{i:03d}.wav"
        rate, channels = (rates or [(16000, 1)])[i % len(rates or [0])]
        write_wav(wav, clips.clip(i) if rate == 16000 and channels == 1 else at_rate(clips.clip(i), rate, channels, i),
                  rate)
        wav.with_suffix(".txt").write_text(clips.texts[i] + "\n")
        paths.append(wav)
    if joined is not None:
        n = len(paths)
        write_wav(joined, np.concatenate([clips.clip(i) for i in range(n)]))
        joined.with_suffix(".txt").write_text(" ".join(clips.texts[i] for i in range(n)) + "\n")
    return paths


@click.command()
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--count", default=HELDOUT_SIZE, show_default=True, help="how many held-out clips to write")
@click.option("--language", default=ENGLISH.name, show_default=True,
              help=f"the clips' language, one of {', '.join(LANGUAGES)}")
@click.option("--fresh", type=int, default=None, metavar="SEED",
              help="new sentences drawn with SEED from the language's vocabulary, none of its held-out set")
@click.option("--target", default=None, help="an adapter target's held-out clips (webbuild.train.target), e.g. klatt")
@click.option("--rates", default="16000", show_default=True,
              help="sample rates the clips are written at, round robin; RATExN: N channels, e.g. 22050,44100x2,48000")
@click.option("--joined", type=click.Path(path_type=Path), help="also write all the clips joined into this 16 kHz WAV "
                                                                "(+ its .txt)")
def main(out_dir: Path, count: int, language: str, fresh: int | None, target: str | None, rates: str,
         joined: Path | None):
    """Write the held-out clips into OUT_DIR as heldout-NNN.wav + heldout-NNN.txt."""
    if language not in LANGUAGES:
        raise click.BadParameter(f"{language!r} has no clips here; name one of {', '.join(LANGUAGES)}",
                                 param_hint="--language")
    require_extra("train", "python -m webbuild.train.clips", "scipy")  # espeak-ng's 22.05 kHz to 16 kHz
    paths = write_heldout_clips(out_dir, count, target, parse_rates(rates), joined, LANGUAGES[language], fresh)
    click.echo(f"wrote {plural(len(paths), 'clip')} to {out_dir}")


if __name__ == "__main__":
    main()
