// Long audio is cut into chunks the model handles, in the middle of the quietest stretch near the
// end of each window, so that words are not split and each chunk keeps little silence at its edges.

const FRAME_S = 0.02; // energy frame
const SMOOTH = 5; // frames: a pause is judged over 100 ms, not one frame

// Returns [start, end) sample ranges covering pcm, each at most maxSeconds long.
export function splitAtQuiet(pcm, sampleRate, maxSeconds, minSeconds = maxSeconds * 0.5) {
  const max = Math.floor(maxSeconds * sampleRate);
  const min = Math.floor(minSeconds * sampleRate);
  const frame = Math.max(1, Math.floor(FRAME_S * sampleRate));
  const chunks = [];
  let start = 0;
  while (pcm.length - start > max) {
    const cut = quietest(pcm, start + min, start + max, frame);
    chunks.push([start, cut]);
    start = cut;
  }
  if (pcm.length > start || !chunks.length) chunks.push([start, pcm.length]);
  return chunks;
}

// Middle of the first quietest run of frames in [from, to): energy summed over SMOOTH frames.
function quietest(pcm, from, to, frame) {
  const energy = [];
  for (let at = from; at + frame <= to; at += frame) {
    let e = 0;
    for (let i = at; i < at + frame; i++) e += pcm[i] * pcm[i];
    energy.push(e);
  }
  if (!energy.length) return to;
  const smooth = energy.map((_, i) => energy.slice(i, i + SMOOTH).reduce((a, b) => a + b, 0));
  const least = Math.min(...smooth);
  const first = smooth.findIndex((e) => e <= least * (1 + 1e-6));
  let last = first;
  while (last + 1 < smooth.length && smooth[last + 1] <= least * (1 + 1e-6)) last++;
  const mid = (first + last + SMOOTH) / 2; // centre of the quiet run, in frames
  return Math.min(to, from + Math.round(mid * frame));
}
