// Long audio is cut into chunks the model handles, at the quietest moment near the end of each
// window, so that words are not split in half.

const FRAME_S = 0.02; // energy frame

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

// Start of the frame with the least energy in [from, to - frame].
function quietest(pcm, from, to, frame) {
  let best = to, bestEnergy = Infinity;
  for (let at = from; at + frame <= to; at += frame) {
    let e = 0;
    for (let i = at; i < at + frame; i++) e += pcm[i] * pcm[i];
    if (e < bestEnergy) { bestEnergy = e; best = at + (frame >> 1); }
  }
  return best;
}
