// A built site's first sample clip on onnxruntime-web's wasm EP in Node, through the site's own runtime
// (runtime/site.js loadSite, forced to wasm, as the page's worker loads it: the graphs the wasm plan
// chose): the encoder's audio features and the prefill's last logits as JSON in OUT, for
// scripts/wasm_parity.py to compare with the Python reference on the same graphs.
//   node scripts/wasm_parity.mjs DIST OUT.json
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { startServer } from '../webbuild/tools/bench/server.mjs';
import { decodeWav } from '../webbuild/tools/bench/wav.mjs';

const dir = path.resolve(process.argv[2]);
const srv = await startServer(dir);
try {
  const { loadSite } = await import(pathToFileURL(path.join(dir, 'runtime/site.js')).href);
  const site = await loadSite(`${srv.url}model/`, { forceEp: 'wasm', threads: 1, fallback: false, onWarning: () => {} });
  const rec = site.recogniser, rt = site.runtime;
  const clip = JSON.parse(await readFile(path.join(dir, 'samples.json'), 'utf8')).samples[0];
  const pcm = decodeWav(new Uint8Array(await readFile(path.join(dir, clip.src))), rt.sample_rate);
  const audio = await rec.encode(pcm);
  const { prefix, suffix, audio_pad } = rt.prompt;
  const ids = [...prefix, ...new Array(audio.dims[1]).fill(audio_pad), ...suffix];
  const { logits } = await rec.prefill(ids, audio, prefix.length);
  const V = rt.decoder.vocab_size;
  await writeFile(process.argv[3], JSON.stringify({ src: clip.src, ep: site.ep, audio_features: Array.from(audio.data),
    logits: Array.from(logits.data.subarray(logits.data.length - V)) }));
} finally {
  await srv.close();
}
process.exit(0);
