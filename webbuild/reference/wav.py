"""WAV files read in blocks, as float64 mono, with every malformation reported as one line.

The twin of the page's parser (webbuild/template/runtime/wav.js): both accept PCM 8/16/24/32-bit
integers and 32/64-bit floats (WAVE_FORMAT_EXTENSIBLE included), any channel count mixed to mono as the
mean of the channels, rates MIN_RATE..MAX_RATE; both refuse the same files with the same reasons
(an AudioError here, the page's error message there): no RIFF/WAVE, no fmt or data chunk, an encoding
other than those, an absurd rate, a data chunk shorter than its header says, no samples, and NaN or
infinite samples. A data size of 0 or 0xFFFFFFFF, or espeak-ng's 0x7FFFF000 when it writes to a pipe,
marks a stream of unknown length: the data runs to the end of the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from webbuild.errors import AudioError

MIN_RATE, MAX_RATE = 1000, 384000
STREAM_SIZES = (0, 0xFFFFFFFF, 0x7FFFF000)  # data sizes that mean "to the end of the file"
CUT_SHORT = "the file was cut short: copy or export it again"  # what to do about a truncated file
PCM, FLOAT, EXTENSIBLE = 1, 3, 0xFFFE
DTYPES = {(PCM, 8): "u1", (PCM, 16): "<i2", (PCM, 24): "V3", (PCM, 32): "<i4", (FLOAT, 32): "<f4", (FLOAT, 64): "<f8"}


@dataclass(frozen=True)
class WavInfo:
    rate: int
    channels: int
    encoding: int  # PCM or FLOAT
    bits: int
    data_offset: int
    frames: int

    @property
    def frame_bytes(self) -> int:
        return self.channels * self.bits // 8


def problem(path: Path, what: str) -> AudioError:
    return AudioError(f"{path}: {what}")


def read_info(path: Path, f: BinaryIO) -> WavInfo:
    """The fmt chunk and where the data starts; the file positioned anywhere."""
    size = f.seek(0, 2)
    if size == 0:
        raise problem(path, "the file is empty")
    f.seek(0)
    head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise problem(path, "not a WAV file (no RIFF/WAVE header); convert it to WAV (PCM or float)")
    fmt = None
    while True:
        chunk = f.read(8)
        if len(chunk) < 8:
            raise problem(path, "no data chunk" if fmt else "no fmt chunk")
        cid, csize = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if cid == b"fmt ":
            fmt = f.read(min(csize, 40))
            f.seek(f.tell() + csize - len(fmt) + (csize & 1))
        elif cid == b"data":
            if fmt is None:
                raise problem(path, "the data chunk comes before the fmt chunk")
            return info_from(path, fmt, f.tell(), csize, size)
        else:
            f.seek(f.tell() + csize + (csize & 1))


def info_from(path: Path, fmt: bytes, offset: int, declared: int, file_size: int) -> WavInfo:
    if len(fmt) < 16:
        raise problem(path, f"fmt chunk of {len(fmt)} bytes, expected at least 16")
    encoding, channels, rate, _, _, bits = struct.unpack("<HHIIHH", fmt[:16])
    if encoding == EXTENSIBLE and len(fmt) >= 26:
        encoding = struct.unpack("<H", fmt[24:26])[0]  # the sub-format GUID's first two bytes
    if (encoding, bits) not in DTYPES:
        raise problem(path, f"unsupported WAV encoding (format {encoding}, {bits}-bit); supported: PCM 8/16/24/32-bit "
                            "and float 32/64-bit")
    if channels < 1:
        raise problem(path, "the fmt chunk says 0 channels")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise problem(path, f"sample rate {rate} Hz is outside {MIN_RATE}-{MAX_RATE} Hz")
    frame = channels * bits // 8
    available = file_size - offset
    size = available if declared in STREAM_SIZES else declared
    if size > available:
        raise problem(path, f"truncated: the data chunk says {declared} bytes, the file holds {available}; {CUT_SHORT}")
    if size % frame:
        raise problem(path, f"truncated: {size} data bytes are not a whole number of {frame}-byte frames; {CUT_SHORT}")
    if size == 0:
        raise problem(path, "the WAV file holds no samples")
    return WavInfo(rate, channels, encoding, bits, offset, size // frame)


def to_mono(raw: bytes, info: WavInfo) -> np.ndarray:
    """Frames of `raw` as float64 in [-1, 1], the channels' mean."""
    dtype = DTYPES[info.encoding, info.bits]
    if dtype == "V3":  # 24-bit: little-endian, sign from the top byte
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8) / 8388608.0
    elif dtype == "u1":
        x = (np.frombuffer(raw, np.uint8).astype(np.float64) - 128.0) / 128.0
    else:
        v = np.frombuffer(raw, dtype)
        x = v.astype(np.float64) / (2.0 ** (info.bits - 1) if info.encoding == PCM else 1.0)
    x = x.reshape(-1, info.channels)
    mono = x[:, 0].copy()
    for c in range(1, info.channels):  # summed in channel order, as wav.js does
        mono += x[:, c]
    return mono / info.channels if info.channels > 1 else mono


def check_finite(path: Path, block: np.ndarray, first_frame: int, rate: int) -> None:
    bad = np.flatnonzero(~np.isfinite(block))
    if bad.size:
        at = first_frame + int(bad[0])
        what = "NaN" if np.isnan(block[bad[0]]) else "infinite"
        raise problem(path, f"sample {at} ({at / rate:.2f} s) is {what}; the file is corrupt")


def wav_info(path: Path) -> WavInfo:
    """The file's header, checked (an AudioError naming the file where it is malformed)."""
    path = Path(path)
    if not path.is_file():
        raise AudioError(f"{path}: no such file")
    with open(path, "rb") as f:
        return read_info(path, f)


def blocks(path: Path, frames_per_block: int = 1 << 16) -> tuple[WavInfo, Iterator[np.ndarray]]:
    """The file's header and its frames as float64 mono blocks, read as they are consumed."""
    path = Path(path)
    info = wav_info(path)

    def read() -> Iterator[np.ndarray]:
        with open(path, "rb") as f:
            f.seek(info.data_offset)
            done = 0
            while done < info.frames:
                n = min(frames_per_block, info.frames - done)
                block = to_mono(f.read(n * info.frame_bytes), info)
                check_finite(path, block, done, info.rate)
                yield block
                done += n

    return info, read()
