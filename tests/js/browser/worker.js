// The loader inside a module worker, as the site's inference worker uses it.
import { loadManifest, loadFiles } from '/runtime/loader.js';

const hex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, '0')).join('');

self.onmessage = async () => {
  try {
    const m = await loadManifest('/');
    let progress = 0;
    const files = await loadFiles(m, Object.keys(m.files), { onProgress: () => progress++ });
    let filesOk = true;
    for (const [name, bytes] of files) filesOk &&= hex(await crypto.subtle.digest('SHA-256', bytes)) === m.files[name].sha256;
    // Transfer, not copy: the buffers are the model's one copy.
    self.postMessage({ filesOk, progress, names: [...files.keys()] }, [...files.values()].map((f) => f.buffer));
  } catch (e) {
    self.postMessage({ error: `${e.name}: ${e.message}` });
  }
};
