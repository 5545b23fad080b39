"""The one resampler of the project: any rate to 16 kHz, band-limited, in float64.

The page (webbuild/template/runtime/resample.js), the Python reference, `webbuild verify` and the
microphone path all resample with this design, so the same file gives the same 16 kHz samples
everywhere (tests/test_resample.py compares the two implementations sample for sample).

Design: windowed-sinc interpolation at the exact rational ratio L/M (the rates over their gcd). Output
sample n sits at input position t = n*M/L and is sum_k x[k] h(t - k), with h a sinc cut off at
CUTOFF of the lower Nyquist, ZEROS zero crossings each side, under a Kaiser window (BETA). The
fraction of t takes at most L values, so each phase's taps are computed once. Samples before the
first and after the last are zero; the output has ceil(N*L/M) samples, as scipy's resample_poly.
Each output depends only on the input samples under its window, so `Resampler` (blocks in, blocks
out, state carried across) gives the same samples however the input is cut into blocks: what a
streamed file or a live microphone needs.
"""

from __future__ import annotations

from math import ceil, gcd

import numpy as np

ZEROS = 32  # sinc zero crossings each side of the centre
CUTOFF = 0.92  # the sinc's cutoff as a fraction of the lower of the two Nyquist frequencies
BETA = 9.0  # Kaiser window: about 90 dB of stopband


def bessel_i0(x: np.ndarray) -> np.ndarray:
    """Modified Bessel function I0 by its power series, term for term as resample.js computes it."""
    x = np.asarray(x, np.float64)
    total, term = np.ones_like(x), np.ones_like(x)
    half = x / 2
    for k in range(1, 64):
        term = term * (half / k) ** 2
        total = total + term
    return total


class Design:
    """The filter for one rate pair: the ratio up/down in lowest terms, the cutoff `fc` in cycles per
    input sample, the half width in input samples, and each phase's taps (computed on first use)."""

    def __init__(self, rate_in: int, rate_out: int):
        g = gcd(rate_in, rate_out)
        self.up, self.down = rate_out // g, rate_in // g
        self.fc = 0.5 * CUTOFF * min(1.0, self.up / self.down)
        self.half = ZEROS / (2 * self.fc)  # the window's half width, in input samples
        self.reach = int(ceil(self.half))  # taps each side of an output's position
        self.norm = float(bessel_i0(np.array(BETA)))
        self._phases: dict[int, np.ndarray] = {}

    def taps(self, phase: int) -> np.ndarray:
        """Weights of input samples floor(t) - reach + 1 ... floor(t) + reach for an output whose position
        t has fraction phase / up."""
        if phase not in self._phases:
            frac = phase / self.up
            offsets = frac - np.arange(-self.reach + 1, self.reach + 1, dtype=np.float64)  # t - k
            self._phases[phase] = self.kernel(offsets)
        return self._phases[phase]

    def kernel(self, x: np.ndarray) -> np.ndarray:
        arg = 2 * self.fc * x
        sinc = np.where(arg == 0, 1.0, np.sin(np.pi * arg) / np.where(arg == 0, 1.0, np.pi * arg))
        inside = np.clip(1 - (x / self.half) ** 2, 0.0, None)
        window = np.where(np.abs(x) <= self.half, bessel_i0(BETA * np.sqrt(inside)) / self.norm, 0.0)
        return 2 * self.fc * sinc * window


class Resampler:
    """Streaming resampler: `push(block)` returns the output samples whose windows the input so far covers,
    `finish()` the rest (the input taken to be zeros past its end). The concatenated output equals
    resample() of the whole input, however it was cut into blocks."""

    BLOCK = 65536  # outputs computed together

    def __init__(self, rate_in: int, rate_out: int = 16000):
        self.d = Design(rate_in, rate_out)
        self.identity = self.d.up == self.d.down
        self.buf = np.zeros(self.d.reach, np.float64)  # the zeros before the first sample
        self.base = -self.d.reach  # input index of buf[0]
        self.seen = 0  # input samples pushed
        self.made = 0  # output samples returned

    def push(self, block: np.ndarray) -> np.ndarray:
        block = np.asarray(block, np.float64)
        self.seen += len(block)
        if self.identity:
            return block
        self.buf = np.concatenate([self.buf, block])
        # output n needs the input up to floor(n*M/L) + reach: n*M < (seen - reach) * L
        return self._emit(-(-(self.seen - self.d.reach) * self.d.up // self.d.down))

    def finish(self) -> np.ndarray:
        if self.identity:
            return np.zeros(0, np.float64)
        self.buf = np.concatenate([self.buf, np.zeros(2 * self.d.reach + 1)])
        return self._emit(-(-self.seen * self.d.up // self.d.down))  # ceil(N * L / M) in all

    def _emit(self, upto: int) -> np.ndarray:
        parts = []
        while self.made < upto:
            end = min(upto, self.made + self.BLOCK)
            parts.append(self._outputs(self.made, end))
            self.made = end
        self._drop()
        return np.concatenate(parts) if parts else np.zeros(0, np.float64)

    def _outputs(self, start: int, end: int) -> np.ndarray:
        """Outputs start..end-1. Outputs L apart share a phase and sit M input samples apart, so each phase's
        outputs are one matrix-vector product over a strided view of the input's windows."""
        d = self.d
        windows = np.lib.stride_tricks.sliding_window_view(self.buf, 2 * d.reach)
        out = np.empty(end - start, np.float64)
        for n0 in range(start, min(end, start + d.up)):
            pos, phase = divmod(n0 * d.down, d.up)
            count = len(range(n0, end, d.up))
            first = pos - d.reach + 1 - self.base
            out[n0 - start::d.up] = windows[first:first + (count - 1) * d.down + 1:d.down] @ d.taps(phase)
        return out

    def _drop(self) -> None:
        """Forget the input no later output reaches."""
        cut = (self.made * self.d.down) // self.d.up - self.d.reach + 1 - self.base
        if cut > 0:
            self.buf = self.buf[cut:]
            self.base += cut


def resample(pcm: np.ndarray, rate_in: int, rate_out: int = 16000) -> np.ndarray:
    """The whole of `pcm` at rate_in as rate_out, float64."""
    r = Resampler(rate_in, rate_out)
    return np.concatenate([r.push(pcm), r.finish()])
