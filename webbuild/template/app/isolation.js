// Cross-origin isolation, which the wasm EP's threads need (SharedArrayBuffer). A host that sends the
// COOP/COEP headers (the build's _headers, `webbuild serve`) isolates the page itself; where it cannot (GitHub
// Pages), the site's own service worker (isolation-sw.js, model.yaml site.isolation_worker) adds them to the
// site's responses. It controls a page only from its next load, so the first visit registers it and reloads
// once; the page waits for this before it starts the model, which a reload would otherwise interrupt.

import { within } from '../runtime/within.js';

// index.html names the service worker here when the build ships one
const WORKER_META = 'meta[name="webbuild-isolation-worker"]';
// set before the reload: a page that comes back still not isolated does not reload again (no loop)
const RELOADED = 'webbuild-isolation-reload';
const READY_MS = 10000; // the worker is a few lines: longer means it will not come (the page goes on without it)
const NO_HEADERS = 'the host sends no COOP/COEP headers';

/** How this page is isolated, or why not: the metrics panel's words (app/metrics.js). */
export const isolation = { isolated: false, note: '' };

// Resolves once the page may start the model (isolation.note says how it is or why it is not isolated); never
// where the page reloads under the service worker.
/** @returns {Promise<typeof isolation>} */
export async function isolatePage() {
  const script = document.querySelector(WORKER_META)?.getAttribute('content');
  const workers = navigator.serviceWorker; // undefined where there are none: not https, some private windows
  if (globalThis.crossOriginIsolated) {
    forget(RELOADED);
    const ours = script && workers?.controller?.scriptURL === new URL(script, location.href).href;
    return said(true, ours ? "by the site's service worker" : "by the host's headers");
  }
  if (!script) {
    await unregister(workers);
    return said(false, `${NO_HEADERS} and the site's service worker is off (model.yaml site.isolation_worker)`);
  }
  if (!workers) return said(false, `${NO_HEADERS} and this browser gives the page no service worker (not https, or a private window)`);
  if (remembered(RELOADED) !== '0') {
    // null: sessionStorage is unavailable, and with it the guard against a reload loop
    return said(false, `${NO_HEADERS} and the site's service worker did not isolate the page`);
  }
  try {
    // the registration too: a browser whose storage is not ready may leave it pending
    await within(workers.register(script).then(() => workers.ready), READY_MS, 'it');
  } catch (e) {
    return said(false, `${NO_HEADERS} and the site's service worker could not be started (${e.message})`);
  }
  sessionStorage.setItem(RELOADED, '1');
  location.reload(); // a normal reload: its request goes through the worker, now active for the site's scope
  return new Promise(() => {});
}

// A build without the service worker: the one an earlier build registered for this site's scope goes (its
// headers stay until the next load); other sites of the origin (USER.github.io/OTHER/) keep theirs.
/** @param {ServiceWorkerContainer | undefined} workers */
async function unregister(workers) {
  const scope = new URL('./', location.href).href;
  const all = await workers?.getRegistrations().catch(() => []) ?? [];
  await Promise.all(all.filter((r) => r.scope === scope).map((r) => r.unregister()));
}

/** @param {boolean} isolated @param {string} how */
function said(isolated, how) {
  return Object.assign(isolation, { isolated, note: `${isolated ? '' : 'not '}cross-origin isolated: ${how}` });
}

// sessionStorage's value for `key` ('0' where unset), null where the browser refuses the storage
/** @param {string} key */
function remembered(key) {
  try {
    return sessionStorage.getItem(key) ?? '0';
  } catch {
    return null;
  }
}

/** @param {string} key */
function forget(key) {
  try {
    sessionStorage.removeItem(key);
  } catch { /* no storage: nothing was set */ }
}
