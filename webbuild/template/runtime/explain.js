// What the visitor reads about a failed or troubled load: the model's file a shard belongs to and which part of it
// ("the model's runtime.json (part 1 of 1)") and what to do, instead of the shard's internal name
// (shards/runtime.json.00000.b0d9....bin), which stays in the console (worker.js) for whoever debugs the site.

/** @typedef {import('./loader.js').LoadedManifest} LoadedManifest */

// The file whose parts include shard `path`, and which part it is; the manifest itself by its role.
/** @param {LoadedManifest | null} manifest @param {string} path */
export function shardName(manifest, path) {
  if (/(^|\/)manifest\.json$/.test(path)) return "the model's list of files (manifest.json)";
  for (const [name, file] of Object.entries(manifest?.files ?? {})) {
    const at = file.parts.findIndex((p) => p.shard === path);
    if (at >= 0) return `the model's ${name} (part ${at + 1} of ${file.parts.length})`;
  }
  return 'a file of the model';
}

// The visitor's message for a load error (loader.js LoadError: code, shard, status; anything else: its message).
/**
 * @param {any} e a caught error: anything may have been thrown
 * @param {LoadedManifest | null} manifest
 */
export function loadErrorMessage(e, manifest) {
  if (!e?.shard) return e?.message ?? String(e);
  const file = shardName(manifest, e.shard);
  if (e.code === 'http' && e.status === 404) {
    return `${file} is missing on the server (HTTP 404): the site may have been updated meanwhile; reload the page.`;
  }
  if (e.code === 'http') {
    return `${file} could not be downloaded (the server answered HTTP ${e.status}, also on every retry); try again in a while.`;
  }
  if (e.code === 'network') return `${file} could not be downloaded (the connection failed, also on every retry); check the connection and try again.`;
  if (e.code === 'corrupt') {
    return `${file} arrived damaged twice (its checksum does not match): the site's files may be being replaced; try again in a while.`;
  }
  return `${file}: ${e.message}`;
}

// A loader warning (LoadWarning) as the visitor reads it; null: the console's alone (a shard fetched again quietly).
/** @param {import('./loader.js').LoadWarning} w @param {LoadedManifest | null} manifest */
export function warningMessage(w, manifest) {
  if (!w.shard) return w.message;
  const file = shardName(manifest, w.shard);
  if (w.code === 'retry') {
    return `Downloading ${file} failed; trying again (${w.attempt} of ${w.retries}) in ${((w.delayMs ?? 0) / 1000).toFixed(1)} s.`;
  }
  if (w.code === 'corrupt') return `${file} arrived damaged; downloading it again.`;
  if (w.code === 'cache-error') {
    return "The model could not be kept in this browser's storage; it loads all the same, and the next visit downloads it again.";
  }
  return null; // cache-corrupt: the stored copy is dropped and downloaded again, nothing the visitor need do
}
