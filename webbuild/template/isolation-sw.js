// The site's service worker (model.yaml site.isolation_worker; app/isolation.js registers it): where the host
// cannot send the headers of cross-origin isolation (GitHub Pages), it adds them to the site's own pages and
// worker scripts, the responses whose headers decide it; the page is then cross-origin isolated, and the wasm EP
// may run threads (SharedArrayBuffer). COEP require-corp, not credentialless: the site loads nothing from another
// origin, and every browser with isolation knows require-corp. Every other request (the model's shards, whose
// fetches, cache and retries are the loader's: runtime/loader.js) it leaves to the network untouched.

/** @typedef {Event & {request: Request, respondWith(response: Promise<Response>): void}} FetchEvent */
/** @typedef {Event & {waitUntil(done: Promise<unknown>): void}} ExtendableEvent */
/**
 * The service worker's global scope, as far as used here (tsconfig's libraries are the page's and workers').
 * @typedef {{skipWaiting(): Promise<void>, clients: {claim(): Promise<void>}, location: Location,
 *   addEventListener(type: string, listener: (e: Event) => void): void}} ServiceWorkerScope
 */
const worker = /** @type {ServiceWorkerScope} */ (/** @type {unknown} */ (self));

const ISOLATION = { 'Cross-Origin-Opener-Policy': 'same-origin', 'Cross-Origin-Embedder-Policy': 'require-corp' };
// a dedicated worker's script needs COEP too: a require-corp page refuses a worker without it
const DESTINATIONS = new Set(['document', 'iframe', 'worker']);

// a new version takes over at once: the page reloads only once, on the first visit
worker.addEventListener('install', () => worker.skipWaiting());
worker.addEventListener('activate', (e) => /** @type {ExtendableEvent} */ (e).waitUntil(worker.clients.claim()));

worker.addEventListener('fetch', (event) => {
  const e = /** @type {FetchEvent} */ (event);
  const { request } = e;
  if (request.method !== 'GET' || !DESTINATIONS.has(request.destination)) return;
  if (new URL(request.url).origin !== worker.location.origin) return;
  e.respondWith(isolated(request));
});

// The response with the isolation headers added (a redirect or an error as it came).
/** @param {Request} request */
async function isolated(request) {
  const response = await fetch(request);
  if (response.type === 'opaqueredirect' || response.status === 0) return response;
  const headers = new Headers(response.headers);
  for (const [name, value] of Object.entries(ISOLATION)) headers.set(name, value);
  return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
}
