"""Long audio cut into chunks the model transcribes one at a time: the one policy of the page
(webbuild/template/runtime/chunk.js, which reads it from runtime.json's `chunking`) and of
`webbuild transcribe`.

Chunks end in pauses. Energy is measured in frames of `frame_seconds`, each summed with the next
`smooth_frames - 1` (a pause is judged over 100 ms, not one frame). A frame is quiet when that energy is
at most `pause_ratio` times the least, or at most `below_peak` times the most, within `floor_seconds`
either side (the local background and the local speech, whatever the recording's level; two recordings
joined with different backgrounds still meet in a pause). A pause is a run of quiet frames at least
`pause_seconds` long that neither starts the chunk (the pause the chunk begins with) nor ends the audio
looked at. A pause is cut `keep_seconds` before the speech after it (never before its middle), so
the next chunk starts with a little of its own background, as the clips a model learns from do. The cut
is the last pause within `join_seconds` of the chunk's start (short sentences travel together up to that
length; 0: every pause ends a chunk), else the first within `max_seconds`. The rest of the audio is one
chunk where it has no such pause and is at most `join_seconds` long, or at most `max_seconds` without a
pause; audio without any pause is cut in the middle of its quietest stretch between `min_seconds` and
`max_seconds`.

Where speech detection is on (webbuild.reference.vad, runtime.json `vad`), the chunks are then folded onto its
speech segments (`to_speech`): segments less than the VAD policy's `merge_seconds` apart are one stretch of speech
(`stretches`: a sentence's pauses stay in), and a chunk keeps only its parts within a stretch, `keep_seconds`
wider (within the chunk); a chunk without speech is not transcribed, one with two stretches becomes two. Audio
without speech has no chunk: an empty transcript without a decode.

No context carries across: each chunk is transcribed on its own (behind the front-end's lead,
webbuild.reference.mel) and the texts are joined with a space. A cut depends only on the audio from the
chunk's start to `max_seconds` + `floor_seconds` + 100 ms after it, so `Chunker` cuts a stream (a file
read in blocks, a microphone) exactly where split_at_quiet cuts the whole, holding at most that much.
Both implementations sum energies in float64 in the same order and compare them the same way, so they
cut at the same samples (tests/test_chunk.py).

Live audio (the page's microphone, `webbuild transcribe --live`) is cut by `LiveChunker` under the policy's
live parameter set (`ChunkPolicy.live()`, runtime.json's `chunking_live`): every pause ends a chunk (join 0),
chunks are at most LIVE_MAX_SECONDS, and the pause is judged over `floor_seconds` = LIVE_FLOOR_SECONDS either
side, so it is heard sooner. A live chunk ends as soon as the audio so far shows a pause after speech, without
waiting for the speech after it: frames are judged one at a time, in order, each once the frames its judgement
reads (`floor_seconds` and the smoothing ahead) have arrived; the first run of `pause_seconds` of quiet frames
after a frame that is not quiet ends the chunk, cut in the middle of that run (the rest of the pause starts the
next chunk). A chunk's leading quiet is cut off as a chunk of its own, without speech (not transcribed), once
the first frame that is not quiet shows where the speech starts: `keep_seconds` before it as above, where that
leaves at least `keep_seconds` + smooth_frames frames (a model hears a little background, not a long pause,
before the speech). Without a pause the chunk is cut at `max_seconds`, in the quietest stretch after
`min_seconds` (as above); the chunk that the end of the audio closes counts as speech. Each decision reads
only the audio before the frame that makes it, so a stream cuts at the same samples however it is split into
blocks; a cut is decided `pause_seconds` + `floor_seconds` +
(smooth_frames - 1) frames after the speech ends (LiveChunker.lag_seconds). A live chunk's decode also ends after
`tokens_per_second` tokens per second of its audio (`token_budget`; LIVE_TOKENS_PER_SECOND, about twice what
fast speech needs): a model that does not stop (random weights, a loop) cannot hold up the next final text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace

import numpy as np

LIVE_MAX_SECONDS = 15.0
LIVE_FLOOR_SECONDS = 0.3
LIVE_TOKENS_PER_SECOND = 10.0


@dataclass(frozen=True)
class ChunkPolicy:
    max_seconds: float = 30.0
    min_seconds: float = 15.0
    join_seconds: float = 30.0
    pause_seconds: float = 0.25
    pause_ratio: float = 4.0  # 6 dB
    below_peak: float = 0.01  # 20 dB
    keep_seconds: float = 0.1
    floor_seconds: float = 1.0
    frame_seconds: float = 0.02
    smooth_frames: int = 5
    tie: float = 1e-6
    tokens_per_second: float = 0.0  # a chunk's decode bound per second of its audio (token_budget); 0: none

    def override(self, max_seconds: float | None = None, join_seconds: float | None = None) -> ChunkPolicy:
        """This policy with another chunk length (its least half of it) or join length; None keeps them."""
        out = self if max_seconds is None else replace(self, max_seconds=max_seconds, min_seconds=max_seconds / 2,
                                                       join_seconds=min(self.join_seconds, max_seconds))
        return out if join_seconds is None else replace(out, join_seconds=min(join_seconds, out.max_seconds))

    def live(self) -> ChunkPolicy:
        """The live parameter set (the module's docstring): every pause ends a chunk, chunks of at most
        LIVE_MAX_SECONDS (partial transcripts redo the open chunk), pauses judged over LIVE_FLOOR_SECONDS, decodes
        bounded by LIVE_TOKENS_PER_SECOND."""
        longest = min(self.max_seconds, LIVE_MAX_SECONDS)
        return replace(self, max_seconds=longest, min_seconds=longest / 2, join_seconds=0.0,
                       floor_seconds=min(self.floor_seconds, LIVE_FLOOR_SECONDS),
                       tokens_per_second=LIVE_TOKENS_PER_SECOND)

    def token_budget(self, samples: int, rate: int, most: int) -> int:
        """The tokens a chunk of `samples` may decode: `most`, bounded by tokens_per_second of its audio."""
        if self.tokens_per_second <= 0:
            return most
        return min(most, math.ceil(samples * self.tokens_per_second / rate))

    def as_json(self) -> dict:
        """runtime.json's `chunking`."""
        return asdict(self)

    @classmethod
    def of_live(cls, runtime: dict | None) -> ChunkPolicy:
        """A built site's live policy: runtime.json's `chunking_live` (older sites: their policy's live())."""
        return cls(**runtime["chunking_live"]) if runtime and "chunking_live" in runtime else cls.of(runtime).live()

    @classmethod
    def of(cls, runtime: dict | None) -> ChunkPolicy:
        """A built site's policy: runtime.json's `chunking` (older sites: their max_chunk_seconds)."""
        if runtime and "chunking" in runtime:
            return cls(**runtime["chunking"])
        if runtime and "max_chunk_seconds" in runtime:
            m = float(runtime["max_chunk_seconds"])
            return replace(cls(), max_seconds=m, min_seconds=m / 2, join_seconds=m)
        return cls()


DEFAULT_POLICY = ChunkPolicy()


@dataclass(frozen=True)
class Sizes:
    """The policy in samples and frames at one rate."""

    max: int
    min: int
    join: int
    frame: int
    pause: int  # frames
    floor: int  # frames either side
    smooth: int  # frames
    keep: int

    @classmethod
    def of(cls, policy: ChunkPolicy, rate: int) -> Sizes:
        frame = max(1, int(policy.frame_seconds * rate))
        frames = lambda s: int(np.floor(s / policy.frame_seconds + 0.5))  # noqa: E731
        return cls(int(policy.max_seconds * rate), int(policy.min_seconds * rate), int(policy.join_seconds * rate),
                   frame, max(1, frames(policy.pause_seconds)), frames(policy.floor_seconds), policy.smooth_frames,
                   int(policy.keep_seconds * rate))

    @property
    def look(self) -> int:
        """Samples looked at for one cut."""
        return self.max + (self.floor + self.smooth) * self.frame


def smoothed(pcm: np.ndarray, frame: int, k: int) -> np.ndarray:
    """Per frame of `pcm`, its energy plus the next k - 1 frames' (float64, summed in order as chunk.js)."""
    count = len(pcm) // frame
    x = pcm[:count * frame].astype(np.float64).reshape(count, frame)
    energy = np.cumsum(x * x, axis=1)[:, -1] if count else np.zeros(0)
    padded = np.concatenate([energy, np.zeros(k)])
    return np.cumsum(np.stack([padded[i:i + count] for i in range(k)], axis=1), axis=1)[:, -1] if count else energy


def pause_cuts(pcm: np.ndarray, policy: ChunkPolicy, z: Sizes) -> list[int]:
    """Where each pause of `pcm` is cut (samples), in order."""
    s = smoothed(pcm, z.frame, z.smooth)
    count = len(s)
    quiet = np.zeros(count, bool)
    for f in range(count):
        near = s[max(0, f - z.floor):f + z.floor + 1]
        quiet[f] = s[f] <= near.min() * policy.pause_ratio or s[f] <= near.max() * policy.below_peak
    cuts, f = [], 0
    while f < count:
        if not quiet[f]:
            f += 1
            continue
        last = f
        while last + 1 < count and quiet[last + 1]:
            last += 1
        if f > 0 and last < count - 1 and last - f + 1 >= z.pause:
            middle = int(np.floor((f + last + z.smooth) / 2 * z.frame + 0.5))
            cuts.append(max(middle, (last + z.smooth) * z.frame - z.keep))
        f = last + 1
    return cuts


def quietest(pcm: np.ndarray, policy: ChunkPolicy, frame: int, k: int) -> int:
    """The middle of the first quietest run of frames of `pcm`, as an index into it."""
    s = smoothed(pcm, frame, k)
    if not len(s):
        return len(pcm)
    quiet = s <= s.min() * (1 + policy.tie)
    first = int(np.argmax(quiet))
    last = first
    while last + 1 < len(s) and quiet[last + 1]:
        last += 1
    return min(len(pcm), int(np.floor((first + last + k) / 2 * frame + 0.5)))


def next_cut(buf: np.ndarray, final: bool, policy: ChunkPolicy, z: Sizes) -> int:
    """Where the chunk that starts buf ends; buf holds at least z.look samples unless it reaches the end of the
    audio (final)."""
    n = len(buf)
    cuts = [c for c in pause_cuts(buf[:z.look], policy, z) if c <= z.max]
    joined = [c for c in cuts if c <= z.join]
    if final and n <= z.join and (n <= z.max):
        return n
    if joined:
        return joined[-1]
    if cuts:
        return cuts[0]
    if final and n <= z.max:
        return n
    return z.min + quietest(buf[z.min:z.max], policy, z.frame, z.smooth)


def split_at_quiet(pcm: np.ndarray, rate: int, policy: ChunkPolicy = DEFAULT_POLICY) -> list[tuple[int, int]]:
    """[start, end) sample ranges covering pcm, each at most policy.max_seconds long."""
    chunks = []
    chunker = Chunker(rate, policy)
    for start, piece in chunker.feed(pcm):
        chunks.append((start, start + len(piece)))
    for start, piece in chunker.finish():
        chunks.append((start, start + len(piece)))
    return chunks


class Chunker:
    """Chunks of a stream of 16 kHz blocks: `feed(block)` yields (start sample, chunk) for every chunk the audio
    so far decides, `finish()` the rest."""

    def __init__(self, rate: int, policy: ChunkPolicy = DEFAULT_POLICY):
        self.policy, self.z = policy, Sizes.of(policy, rate)
        self.buf = np.zeros(0, np.float32)
        self.start = 0  # sample index of buf[0]
        self.emitted = 0

    def feed(self, block: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        self.buf = np.concatenate([self.buf, np.asarray(block, np.float32)])
        while len(self.buf) >= self.z.look:
            yield self._take(next_cut(self.buf, False, self.policy, self.z))

    def finish(self) -> Iterator[tuple[int, np.ndarray]]:
        while len(self.buf) or not self.emitted:
            yield self._take(next_cut(self.buf, True, self.policy, self.z) if len(self.buf) else 0)

    def _take(self, cut: int) -> tuple[int, np.ndarray]:
        piece, self.buf = self.buf[:cut], self.buf[cut:]
        start, self.start = self.start, self.start + cut
        self.emitted += 1
        return start, piece


def chunks_of(blocks: Iterable[np.ndarray], rate: int, policy: ChunkPolicy = DEFAULT_POLICY,
              speech: list[tuple[int, int]] | None = None) -> Iterator[np.ndarray]:
    """The chunks of a stream of blocks; with `speech` (stretches of speech), their parts within them."""
    chunker = Chunker(rate, policy)
    keep = Sizes.of(policy, rate).keep
    for start, piece in _fed(chunker, blocks):
        if speech is None:
            yield piece
            continue
        for a, b in to_speech(start, start + len(piece), speech, keep):
            yield piece[a - start:b - start]


def _fed(chunker: Chunker, blocks: Iterable[np.ndarray]) -> Iterator[tuple[int, np.ndarray]]:
    for block in blocks:
        yield from chunker.feed(block)
    yield from chunker.finish()


def stretches(segments: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Speech segments joined where less than `gap` samples apart: stretches of speech."""
    out: list[tuple[int, int]] = []
    for a, b in segments:
        if out and a - out[-1][1] < gap:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def to_speech(start: int, end: int, speech: list[tuple[int, int]], keep: int) -> list[tuple[int, int]]:
    """The parts of the chunk [start, end) within stretches of speech, `keep` samples wider (within the chunk); none
    where it holds no speech."""
    return [(max(start, a - keep), min(end, b + keep)) for a, b in speech if a < end and b > start]


class LiveChunker:
    """Chunks of live 16 kHz audio under a live policy (ChunkPolicy.live(); the module's docstring): `feed(block)`
    returns (start sample, chunk, speech) for every chunk the audio so far ends, `finish()` the rest (the person
    stopped); a chunk without speech is not transcribed. `buf` is the open chunk's audio; `spoke`: whether a frame
    of it judged so far is not quiet."""

    def __init__(self, rate: int, policy: ChunkPolicy):
        self.policy, self.z = policy, Sizes.of(policy, rate)
        self.rate = rate
        self.buf = np.zeros(0, np.float32)
        self.start = 0  # sample index of buf[0]
        self.emitted = 0
        self._open()

    @property
    def lag_seconds(self) -> float:
        """How long after the speech ends a pause's cut is decided: the pause, then what its last frame's
        judgement reads ahead."""
        z = self.z
        return (z.pause + z.floor + z.smooth - 1) * z.frame / self.rate

    def _open(self) -> None:
        """A new chunk begins at buf[0]: its frames are judged from the first."""
        self.energy: list[float] = []  # per complete frame of buf
        self.smooth: list[float] = []  # per frame whose smoothing has arrived
        self.judged = 0  # frames judged
        self.spoke = False
        self.run = 0  # quiet frames judged since the last one that was not

    def feed(self, block: np.ndarray) -> list[tuple[int, np.ndarray, bool]]:
        self.buf = np.concatenate([self.buf, np.asarray(block, np.float32)])
        out = []
        while (cut := self._decide()) is not None:
            out.append(self._take(*cut))
        return out

    def finish(self) -> list[tuple[int, np.ndarray, bool]]:
        out = []
        while len(self.buf) > self.z.max:
            out.append(self._take(self._longest(), self.spoke))
        if len(self.buf) or not self.emitted:
            out.append(self._take(len(self.buf), True))
        return out

    def _decide(self) -> tuple[int, bool] | None:
        """The open chunk's cut and whether it holds speech, once the audio so far decides it (frame by frame, in
        order); None: not yet."""
        z = self.z
        while (len(self.energy) + 1) * z.frame <= len(self.buf):
            f = len(self.energy)
            x = self.buf[f * z.frame:(f + 1) * z.frame].astype(np.float64)
            self.energy.append(float(np.cumsum(x * x)[-1]))
            if len(self.energy) >= z.smooth:
                g = len(self.energy) - z.smooth
                self.smooth.append(float(np.cumsum(self.energy[g:g + z.smooth])[-1]))
            while self.judged + z.floor < len(self.smooth):
                if (cut := self._judge(self.judged)) is not None:
                    return cut
            if len(self.energy) * z.frame >= z.max:
                return self._longest(), self.spoke
        return None

    def _judge(self, f: int) -> tuple[int, bool] | None:
        """Judges frame f (its neighbours have arrived); the cut when it completes a pause after speech, or ends
        a long leading quiet."""
        z, s = self.z, self.smooth
        near = s[max(0, f - z.floor):f + z.floor + 1]
        quiet = s[f] <= min(near) * self.policy.pause_ratio or s[f] <= max(near) * self.policy.below_peak
        self.judged += 1
        lead = (f - 1 + z.smooth) * z.frame - z.keep  # where a leading quiet ends
        if not quiet and not self.spoke and lead >= z.keep + z.smooth * z.frame:
            return lead, False
        self.spoke |= not quiet
        self.run = self.run + 1 if quiet else 0
        if not (self.spoke and self.run >= z.pause):
            return None
        first = f - self.run + 1
        return int(np.floor((first + f + z.smooth) / 2 * z.frame + 0.5)), True

    def _longest(self) -> int:
        """The cut of a chunk that reached max_seconds without a pause: its quietest stretch after min_seconds."""
        z = self.z
        return z.min + quietest(self.buf[z.min:z.max], self.policy, z.frame, z.smooth)

    def _take(self, cut: int, speech: bool) -> tuple[int, np.ndarray, bool]:
        piece, self.buf = self.buf[:cut], self.buf[cut:]
        start, self.start = self.start, self.start + cut
        self.emitted += 1
        self._open()
        return start, piece, speech


def live_chunks(blocks: Iterable[np.ndarray], rate: int, policy: ChunkPolicy
                ) -> Iterator[tuple[int, np.ndarray, bool]]:
    """(start sample, chunk, speech) of a live stream of blocks, as the page's live mode cuts it."""
    chunker = LiveChunker(rate, policy)
    for block in blocks:
        yield from chunker.feed(block)
    yield from chunker.finish()
