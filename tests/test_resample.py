"""The one resampler and WAV reader: webbuild/reference (numpy) against its JS twins (runtime/resample.js,
runtime/wav.js, app/audio.js under Node), sample for sample, on every accepted WAV encoding and rate; both
refuse the same malformed files with the same one line."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from webbuild.errors import AudioError
from webbuild.pipeline.render import TEMPLATE_DIR
from webbuild.reference.audio import read_wav, stream_wav
from webbuild.reference.resample import Resampler, resample

pytestmark = pytest.mark.skipif(not shutil.which("node"), reason="no node")
RATES = [8000, 11025, 16000, 22050, 32000, 44100, 48000]


def node(script: str) -> dict:
    """An ES module read from stdin (its data inline: too long for a command line), run in the template folder."""
    out = subprocess.run(["node", "--input-type=module"], input=script, cwd=TEMPLATE_DIR, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wav_bytes(frames: np.ndarray, rate: int, encoding: int, bits: int, extensible: bool = False,
              declared: int | None = None) -> bytes:
    """A WAV file of `frames` ([n, channels] raw sample values)."""
    channels = frames.shape[1]
    if bits == 24:
        v = frames.astype("<i4").reshape(-1)
        data = b"".join(int(x & 0xFFFFFF).to_bytes(3, "little") for x in v)
    else:
        dtypes = {(1, 8): "u1", (1, 16): "<i2", (1, 32): "<i4", (3, 32): "<f4", (3, 64): "<f8"}
        data = frames.astype(dtypes[encoding, bits]).tobytes()
    block = channels * bits // 8
    tag = 0xFFFE if extensible else encoding
    fmt = struct.pack("<HHIIHH", tag, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    if extensible:
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", encoding) + b"\x00" * 14
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data) if declared is None else declared) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def speechlike(rate: int, seconds: float, seed: int = 0) -> np.ndarray:
    """Full-band noise bursts over a few tones, -1..1: content above 8 kHz where the rate has it."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 3100 * t) + 0.1 * rng.standard_normal(len(t))
    return np.clip(x * (0.5 + 0.5 * np.sin(2 * np.pi * 1.3 * t)), -1, 1)


def js_read(paths: list[Path]) -> list[list[float] | str]:
    """Each file as the page reads it (app/audio.js decodeToMono16k on its bytes), or its error message."""
    return node(f"""
      import {{ readFileSync }} from 'node:fs';
      import {{ decodeToMono16k }} from './app/audio.js';
      const out = [];
      for (const p of {json.dumps([str(p) for p in paths])}) {{
        const b = readFileSync(p);
        try {{ out.push(Array.from(await decodeToMono16k(b.buffer.slice(b.byteOffset, b.byteOffset + b.length), p))); }}
        catch (e) {{ out.push(e.message); }}
      }}
      console.log(JSON.stringify(out));
    """)  # type: ignore[return-value]


@pytest.mark.parametrize("rate", RATES)
def test_numpy_and_js_resample_alike_and_stream(rate):
    """Float64 in, float64 out: the two implementations agree to rounding; cut into odd blocks, the JS one
    gives the whole's samples (the microphone's case)."""
    x = speechlike(rate, 1.3, seed=rate)
    r = node(f"""
      import {{ Resampler, resample }} from './runtime/resample.js';
      const x = Float64Array.from({json.dumps(x.tolist())});
      const whole = resample(x, {rate});
      const r = new Resampler({rate}), parts = [];
      for (let i = 0, b = 1; i < x.length; i += b, b = (b * 7 + 3) % 4001 + 1) {{
        parts.push(...r.push(x.subarray(i, i + b)));
      }}
      parts.push(...r.finish());
      console.log(JSON.stringify({{ whole: Array.from(whole), blocks: parts }}));
    """)
    ours = resample(x, rate)
    assert len(r["whole"]) == len(ours) == -(-len(x) * 16000 // rate)
    assert np.abs(np.array(r["whole"]) - ours).max() <= 1e-12
    assert r["blocks"] == r["whole"]


def test_python_resampler_streams():
    rng = np.random.default_rng(1)
    x = speechlike(44100, 3.0)
    r, parts, i = Resampler(44100), [], 0
    while i < len(x):
        b = int(rng.integers(1, 9000))
        parts.append(r.push(x[i:i + b]))
        i += b
    parts.append(r.finish())
    # the same sums, whose BLAS order may differ with the block's size
    np.testing.assert_allclose(np.concatenate(parts), resample(x, 44100), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rate", [22050, 44100, 48000])
def test_band_limited(rate):
    """A tone above 8 kHz vanishes (no aliasing into the band the model hears); one at 1 kHz passes intact."""
    t = np.arange(rate) / rate
    above = resample(np.sin(2 * np.pi * 9000 * t), rate)[800:-800]
    assert np.abs(above).max() < 1e-4
    passed = resample(np.sin(2 * np.pi * 1000 * t), rate)
    expect = np.sin(2 * np.pi * 1000 * np.arange(len(passed)) / 16000)
    assert np.abs(passed - expect)[800:-800].max() < 1e-4


ENCODINGS = [(1, 8), (1, 16), (1, 24), (1, 32), (3, 32), (3, 64)]


def raw_frames(x: np.ndarray, encoding: int, bits: int) -> np.ndarray:
    if encoding == 3:
        return x
    scale = 2 ** (bits - 1) - 1
    v = np.round(x * scale)
    return v + 128 if bits == 8 else v


@pytest.mark.parametrize(("encoding", "bits"), ENCODINGS)
def test_every_encoding_reads_the_same_in_python_and_the_page(tmp_path, encoding, bits):
    """8/16/24/32-bit PCM and float 32/64, mono and 3 channels (one as WAVE_FORMAT_EXTENSIBLE), at 22.05, 44.1 and
    48 kHz: the page's samples equal the reference's within 1e-5 (float32 rounding)."""
    paths = []
    for rate, channels in ((22050, 1), (44100, 2), (48000, 3)):
        x = np.stack([speechlike(rate, 0.6, seed=c) * (1 - 0.2 * c) for c in range(channels)], axis=1)
        path = tmp_path / f"{rate}-{channels}.wav"
        path.write_bytes(wav_bytes(raw_frames(x, encoding, bits), rate, encoding, bits, extensible=channels == 3))
        paths.append(path)
    for path, js in zip(paths, js_read(paths)):
        py = read_wav(path)
        assert isinstance(js, list), js
        assert len(js) == len(py) and np.abs(np.array(js) - py).max() <= 1e-5


def test_16k_int16_reads_unchanged(tmp_path):
    """At 16 kHz nothing is resampled: int16 / 32768, as before."""
    x = np.round(speechlike(16000, 0.5) * 32767)[:, None]
    (tmp_path / "a.wav").write_bytes(wav_bytes(x, 16000, 1, 16))
    np.testing.assert_array_equal(read_wav(tmp_path / "a.wav"), (x[:, 0] / 32768).astype(np.float32))


def malformed(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Each malformed case: its file and the words of its one-line message."""
    x = speechlike(16000, 0.2)[:, None]
    nan, inf = x.copy(), x.copy()
    nan[100, 0], inf[3000, 0] = np.nan, np.inf
    pcm16 = wav_bytes(np.round(x * 32767), 16000, 1, 16)
    cases = {
        "nan": (wav_bytes(nan, 16000, 3, 32), "sample 100 (0.01 s) is NaN; the file is corrupt"),
        "inf": (wav_bytes(inf, 16000, 3, 32), "sample 3000 (0.19 s) is infinite; the file is corrupt"),
        "truncated": (pcm16[:len(pcm16) - 1001], "truncated: the data chunk says 6400 bytes, the file holds 5399; "
                                                   "the file was cut short: copy or export it again"),
        "empty data": (wav_bytes(x[:0], 16000, 1, 16, declared=2),
                       "truncated: the data chunk says 2 bytes, the file holds 0"),
        "no samples": (wav_bytes(x[:0], 44100, 1, 16), "the WAV file holds no samples"),
        "empty file": (b"", "the file is empty"),
        "rate 0": (wav_bytes(x, 0, 1, 16), "sample rate 0 Hz is outside 1000-384000 Hz"),
        "rate 4 GHz": (wav_bytes(x, 4_000_000_000, 1, 16), "sample rate 4000000000 Hz is outside 1000-384000 Hz"),
        "not wav": (b"ID3\x03junk" * 10, "not a WAV file (no RIFF/WAVE header)"),
        "12-bit": (wav_bytes(x, 16000, 1, 16)[:34] + struct.pack("<H", 12) + wav_bytes(x, 16000, 1, 16)[36:],
                   "unsupported WAV encoding (format 1, 12-bit)"),
    }
    out = {}
    for name, (data, words) in cases.items():
        path = tmp_path / (name.replace(" ", "-") + ".wav")
        path.write_bytes(data)
        out[name] = path, words
    return out


def test_malformed_audio_is_one_line_in_python_and_the_page(tmp_path):
    cases = malformed(tmp_path)
    page = dict(zip(cases, js_read([p for p, _ in cases.values()])))
    for name, (path, words) in cases.items():
        with pytest.raises(AudioError) as err:
            read_wav(path)
        assert str(err.value).startswith(f"{path}: ") and words in str(err.value) and "\n" not in str(err.value), name
        if name != "not wav":  # the page hands other containers to the browser's decoder
            assert page[name] == f"{path}: " + str(err.value).split(": ", 1)[1], name


def test_stream_wav_holds_one_block(tmp_path):
    """stream_wav reads as it goes: a file longer than a block comes in several, the first before the rest is read."""
    x = np.round(speechlike(44100, 4.0) * 32767)[:, None]
    (tmp_path / "a.wav").write_bytes(wav_bytes(x, 44100, 1, 16))
    blocks = list(stream_wav(tmp_path / "a.wav", frames_per_block=44100))
    assert len(blocks) >= 4 and max(len(b) for b in blocks) <= 16100
    np.testing.assert_array_equal(np.concatenate(blocks), read_wav(tmp_path / "a.wav"))


def test_other_containers_decode_at_the_rate_their_header_states():
    """The page decodes FLAC, Ogg and MP3 at the file's own rate (so the browser resamples nothing), read from
    the header; WebM (Opus: always 48 kHz) and unknown ones at 48 kHz."""
    flac = b"fLaC" + bytes(14) + bytes([0x0A, 0xC4, 0x40])  # STREAMINFO's 20-bit rate: 44100
    ogg = b"OggS" + bytes(24)
    vorbis = ogg + b"\x01vorbis" + bytes(5) + struct.pack("<I", 22050)
    id3 = b"ID3\x03\x00\x00\x00\x00\x00\x0a" + bytes(10)
    cases = {"flac": flac, "opus": ogg + b"OpusHead", "vorbis": vorbis, "mp3": b"\xff\xfb\x90\x00",
             "mp3 mpeg2 behind id3": id3 + b"\xff\xf3\x94\x00", "mp3 mpeg2.5": b"\xff\xe3\x08\x00",
             "webm": b"\x1a\x45\xdf\xa3" + bytes(8)}
    got = node(f"""
      import {{ containerRate }} from './app/audio.js';
      const cases = {json.dumps({k: list(v) for k, v in cases.items()})};
      const rates = Object.entries(cases).map(([k, v]) => [k, containerRate(Uint8Array.from(v))]);
      console.log(JSON.stringify(Object.fromEntries(rates)));
    """)
    assert got == {"flac": 44100, "opus": 48000, "vorbis": 22050, "mp3": 44100, "mp3 mpeg2 behind id3": 24000,
                   "mp3 mpeg2.5": 8000, "webm": None}


def test_write_wav_keeps_the_channels(tmp_path):
    """[n, channels] is written as that many interleaved channels (make e2e's stereo clips), [n] as mono; the
    project's reader gives back their mean."""
    from webbuild.reference.audio import write_wav
    from webbuild.reference.wav import blocks, wav_info

    t = np.arange(4410) / 44100
    x = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.4 * np.sin(2 * np.pi * 660 * t)], axis=1)
    for name, pcm, channels in (("stereo.wav", x, 2), ("mono.wav", x[:, 0], 1)):
        write_wav(tmp_path / name, pcm, 44100)
        info = wav_info(tmp_path / name)
        assert (info.rate, info.channels, info.frames) == (44100, channels, len(t))
        _, parts = blocks(tmp_path / name)
        got = np.concatenate(list(parts))
        want = pcm.mean(axis=1) if channels == 2 else pcm
        assert np.abs(got - want).max() < 2 / 32767
