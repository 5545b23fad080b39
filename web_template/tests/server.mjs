// A real static HTTP server for loader tests, with scripted faults per path.
// faults.set('/shards/x.bin', ['corrupt', 'status:500']) makes the next two requests for that
// path fail in those ways, one fault per request, then it serves normally again.
import http from 'node:http';
import { readFile } from 'node:fs/promises';
import path from 'node:path';

export async function startServer(root) {
  const srv = { root, faults: new Map(), log: [] };
  const server = http.createServer((req, res) => handle(srv, req, res).catch((e) => {
    res.statusCode = 500;
    res.end(String(e));
  }));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  srv.url = `http://127.0.0.1:${server.address().port}/`;
  srv.close = () => { server.closeAllConnections(); return new Promise((r) => server.close(r)); };
  srv.shardRequests = () => srv.log.filter((r) => r.path.startsWith('/shards/'));
  return srv;
}

async function handle(srv, req, res) {
  const urlPath = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  srv.log.push({ path: urlPath, range: req.headers.range });
  const fault = srv.faults.get(urlPath)?.shift();
  if (fault?.startsWith('status:')) {
    res.writeHead(Number(fault.slice(7)), { 'retry-after': '0' });
    return res.end('injected failure');
  }
  let body;
  try {
    body = await readFile(path.join(srv.root, path.normalize(urlPath)));
  } catch {
    res.writeHead(404);
    return res.end('not found');
  }
  if (fault === 'corrupt') {
    body = Buffer.from(body);
    body[body.length >> 1] ^= 0xff; // same length, one bad byte: only a hash can tell
  }
  const start = fault === 'norange' ? 0 : rangeStart(req.headers.range);
  const headers = { 'content-type': 'application/octet-stream', 'accept-ranges': 'bytes' };
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

function rangeStart(range) {
  const m = /^bytes=(\d+)-$/.exec(range ?? '');
  return m ? Number(m[1]) : 0;
}
