"""The browser's greedy tokens against the Python reference's, on the same build: where the two first
part, which token each chose there, and how close each was to choosing another (its margin: the chosen
logit minus the runner-up's; runtime/greedy.js `pick`, webbuild.reference.transcribe `pick`).

Greedy decoding turns any numerical difference between two runtimes into a different token where the
top two logits are within that difference of each other: such a flip says nothing about the site.
A clip whose tokens differ therefore passes only when, at the first differing position, the margins are
all under MAX_TIE_MARGIN: if the two runtimes' logits differ by at most d each, a flip needs the browser's
margin and the reference's to be at most 2d both (each side's runner-up is at least the other side's
choice), so both are judged. The runtime records no margin for its end-of-sequence pick, so where one
side ended there, only the other side's margin is known and judged. After the first difference the
contexts differ and so may everything after it: it is reported, never judged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# In logits. Measured on the example (examples/tiny-asr, fp32 variant, the 4 samples and 20 held-out clips of
# `make e2e`, 29 clip runs): where the tokens agree, the page's margin differs from the reference's (float32
# logits of onnxruntime CPU) by at most 0.0037, on onnxruntime-web's wasm EP and on its WebGPU EP (SwiftShader)
# alike, so each logit moves by about 0.002 at most and a flip needs margins of about 0.004 or less. 0.05 leaves
# a dozen times that for other GPUs' kernels (other summation orders) and longer contexts, yet is ten times
# under the example's smallest margin (0.49) and a hundred under its typical ones (5-18): a wrong kernel or
# cache, which moves logits by whole units, cannot pass under it.
MAX_TIE_MARGIN = 0.05


@dataclass
class Difference:
    """The first position where the browser's tokens and the reference's differ. A token is None where
    that side ended (end of sequence) before it; a margin is None where that side recorded none."""

    position: int
    browser_token: int | None
    reference_token: int | None
    browser_margin: float | None
    reference_margin: float | None

    @property
    def under_margin(self) -> bool:
        """A near tie on every side that chose a token there (an ended side has no margin): a numerical
        flip, not a wrong site. A side with a token but no margin (a page that reports none) never passes."""
        sides = ((self.browser_token, self.browser_margin), (self.reference_token, self.reference_margin))
        return all(m is not None and m < MAX_TIE_MARGIN for t, m in sides if t is not None)

    def describe(self) -> str:
        return (f"tokens differ from the Python reference at position {self.position}: browser "
                f"{_side(self.browser_token, self.browser_margin)}, Python "
                f"{_side(self.reference_token, self.reference_margin)}")

    def as_dict(self) -> dict:
        return {**asdict(self), "under_margin": self.under_margin, "max_tie_margin": MAX_TIE_MARGIN,
                "summary": self.describe()}


def _side(token: int | None, margin: float | None) -> str:
    what = "ended" if token is None else f"token {token}"
    return f"{what} (margin {'not recorded' if margin is None else f'{margin:.4f}'})"


def _at(values: list | None, i: int):
    return values[i] if values is not None and i < len(values) else None


def first_difference(browser: list[int], browser_margins: list[float] | None, reference: list[int],
                     reference_margins: list[float]) -> Difference | None:
    """None when the token lists are equal; else the first position where they differ."""
    i = next((i for i, (a, b) in enumerate(zip(browser, reference)) if a != b), min(len(browser), len(reference)))
    if i == len(browser) == len(reference):
        return None
    return Difference(i, _at(browser, i), _at(reference, i), _at(browser_margins, i), _at(reference_margins, i))


def margin_drift(browser_margins: list[float] | None, reference_margins: list[float], upto: int) -> float | None:
    """The largest |browser margin - reference margin| over the first `upto` tokens (where both chose the
    same token): how far apart the two runtimes' logits are on this clip; None without margins."""
    if not browser_margins or upto == 0:
        return None
    pairs = list(zip(browser_margins[:upto], reference_margins[:upto]))
    return max(abs(a - b) for a, b in pairs) if pairs else None


def flatten(chunks: list[list] | None) -> list | None:
    """The page's per-chunk lists (tokens, margins) as one; None when the page reported none."""
    return None if chunks is None else [x for chunk in chunks for x in chunk]


def token_summary(rows: list[dict]) -> dict:
    """The report's token counts over the clips compared with the reference: equal token lists, clips
    passed under the margin, and per provider the largest margin drift (what MAX_TIE_MARGIN is set from)."""
    compared = [r for r in rows if r["reference_tokens"] is not None and r["error"] is None]
    drift: dict[str, float] = {}
    for r in compared:
        if r["margin_drift"] is not None:
            drift[r["ep"]] = max(drift.get(r["ep"], 0.0), r["margin_drift"])
    return {"max_tie_margin": MAX_TIE_MARGIN, "tokens_compared": len(compared),
            "reference_tokens_equal": sum(r["difference"] is None for r in compared),
            "passed_under_margin": sum(r["ok"] and r["under_margin"] for r in compared), "margin_drift": drift}
