// Runs a page in headless Chromium (a fresh process per call, profile kept in profileDir) and
// returns what the page posts to /result plus the renderer's peak resident memory (Linux).
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { once } from 'node:events';

export const CHROMIUM = process.env.CHROMIUM ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);

const FLAGS = ['--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-extensions'];

export async function runPage(srv, pageUrl, profileDir, { timeoutMs = 60000 } = {}) {
  const result = srv.nextResult();
  const child = spawn(CHROMIUM, [...FLAGS, `--user-data-dir=${profileDir}`, pageUrl], { stdio: 'ignore' });
  let timer;
  try {
    const r = await Promise.race([result, new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no result from ${pageUrl} in ${timeoutMs} ms`)), timeoutMs);
    })]);
    r.rendererPeakRssBytes = rendererPeak(child.pid);
    return r;
  } finally {
    clearTimeout(timer);
    const exited = once(child, 'exit');
    child.kill('SIGTERM');
    await exited;
  }
}

// VmHWM (peak RSS) of the renderer processes under the browser process `root`.
function rendererPeak(root) {
  const parent = new Map();
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      parent.set(Number(pid), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch { /* exited meanwhile */ }
  }
  const under = (pid) => { for (let p = pid; p > 1; p = parent.get(p)) if (p === root) return true; return false; };
  let peak = 0;
  for (const pid of parent.keys()) {
    try {
      if (!under(pid) || !readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('--type=renderer')) continue;
      const kb = Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);
      peak = Math.max(peak, kb * 1024);
    } catch { /* exited meanwhile */ }
  }
  return peak;
}
