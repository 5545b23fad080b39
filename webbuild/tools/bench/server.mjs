// A real static HTTP server for loader tests, with scripted faults per path.
// faults.set('/shards/x.bin', ['corrupt', 'status:500']) makes the next two requests for that
// path fail in those ways, one fault per request, then it serves normally again; 'delay:MS' answers that
// request MS milliseconds late.
import http from 'node:http';
import { readFile } from 'node:fs/promises';
import path from 'node:path';

/**
 * The server's state: faults by path, the requests served, the waiting nextResult() calls (a posted
 * result is parsed JSON: untyped); url, close(), nextResult() and shardRequests() are set by startServer.
 * @typedef {{root: string, mounts: Record<string, string>, faults: Map<string, string[]>, log: {path: string, range?: string}[],
 *   results: ((value: any) => void)[], [k: string]: any}} Srv
 */

// mounts: {'/runtime/': dir} serves extra folders; POST /result resolves srv.nextResult().
/**
 * @param {string} root
 * @param {{mounts?: Record<string, string>}} [opts]
 */
export async function startServer(root, { mounts = {} } = {}) {
  /** @type {Srv} */
  const srv = { root, mounts, faults: new Map(), log: [], results: [] };
  srv.nextResult = () => new Promise((resolve) => srv.results.push(resolve));
  const server = http.createServer((req, res) => handle(srv, req, res).catch((e) => {
    res.statusCode = 500;
    res.end(String(e));
  }));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  srv.url = `http://127.0.0.1:${/** @type {import('node:net').AddressInfo} */ (server.address()).port}/`;
  srv.close = () => { server.closeAllConnections(); return new Promise((r) => server.close(r)); };
  srv.shardRequests = () => srv.log.filter((r) => r.path.startsWith('/shards/'));
  return srv;
}

/**
 * @param {Srv} srv
 * @param {http.IncomingMessage} req
 * @param {http.ServerResponse} res
 */
async function handle(srv, req, res) {
  const urlPath = decodeURIComponent(new URL(/** @type {string} */ (req.url), 'http://x').pathname); // a server's request has one
  if (req.method === 'POST' && urlPath === '/result') return postResult(srv, req, res);
  srv.log.push({ path: urlPath, range: req.headers.range });
  const fault = srv.faults.get(urlPath)?.shift();
  if (fault?.startsWith('delay:')) await new Promise((r) => setTimeout(r, Number(fault.slice(6))));
  if (fault?.startsWith('status:')) {
    res.writeHead(Number(fault.slice(7)), { 'retry-after': '0' });
    return res.end('injected failure');
  }
  let body;
  try {
    body = await readFile(resolvePath(srv, urlPath));
  } catch {
    res.writeHead(404);
    return res.end('not found');
  }
  if (fault === 'corrupt') {
    body = Buffer.from(body);
    body[body.length >> 1] ^= 0xff; // same length, one bad byte: only a hash can tell
  }
  const start = fault === 'norange' ? 0 : rangeStart(req.headers.range);
  const headers = { 'content-type': TYPES[path.extname(urlPath)] ?? 'application/octet-stream', 'accept-ranges': 'bytes' };
  if (start > 0) {
    res.writeHead(206, { ...headers, 'content-range': `bytes ${start}-${body.length - 1}/${body.length}` });
    body = body.subarray(start);
  } else {
    res.writeHead(200, { ...headers, 'content-length': body.length });
  }
  if (fault === 'cut') { // half the body, then the connection drops
    res.write(body.subarray(0, body.length >> 1), () => setTimeout(() => res.destroy(), 10));
    return;
  }
  res.end(body);
}

/** @param {string | undefined} range */
function rangeStart(range) {
  const m = /^bytes=(\d+)-$/.exec(range ?? '');
  return m ? Number(m[1]) : 0;
}

/** @type {Record<string, string>} */
const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.json': 'application/json' };

/**
 * @param {Srv} srv
 * @param {string} urlPath
 */
function resolvePath(srv, urlPath) {
  const clean = path.normalize(urlPath);
  for (const [prefix, dir] of Object.entries(srv.mounts)) {
    if (clean.startsWith(prefix)) return path.join(dir, clean.slice(prefix.length));
  }
  return path.join(srv.root, clean);
}

/**
 * @param {Srv} srv
 * @param {http.IncomingMessage} req
 * @param {http.ServerResponse} res
 */
async function postResult(srv, req, res) {
  let text = '';
  for await (const chunk of req) text += chunk;
  res.end('ok');
  srv.results.shift()?.(JSON.parse(text));
}
