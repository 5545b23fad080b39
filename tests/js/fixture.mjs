// Builds real shard folders with the Python packer (webbuild/pipeline/shard.py), as the build does.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const VENV_PY = path.join(REPO, '.venv/bin/python');
export const PYTHON = process.env.WEBBUILD_PYTHON ?? (existsSync(VENV_PY) ? VENV_PY : 'python3');

export function tempDir() {
  return mkdtempSync(path.join(tmpdir(), 'webbuild-loader-'));
}

// Removes a tempDir: retried, as a closed Chromium's last processes may still write into its profile there
// (ENOTEMPTY once failed a test run's after hook, every test of it passed).
/** @param {string | undefined} dir */
export function removeTempDir(dir) {
  if (dir) rmSync(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
}

// sizes: {logical name: byte count}; returns {dir, manifest, sources: {name: Buffer}}.
export function buildFixture(dir, sizes, { maxBytes, modelId = 'tiny-asr', sources = {}, variants = {} }) {
  const src = path.join(dir, 'src');
  mkdirSync(src, { recursive: true });
  const args = [];
  const data = {};
  for (const [name, size] of Object.entries(sizes)) {
    data[name] = sources[name] ?? randomBytes(size);
    writeFileSync(path.join(src, name), data[name]);
    args.push(`${name}=${path.join(src, name)}`);
  }
  for (const [v, files] of Object.entries(variants)) args.push('--variant', `${v}=${files.join(',')}`);
  const out = path.join(dir, 'site');
  execFileSync(PYTHON, ['-m', 'webbuild.pipeline.shard', out, ...args, '--model-id', modelId, '--max-bytes', String(maxBytes)],
    { cwd: REPO, stdio: ['ignore', 'ignore', 'inherit'] });
  return { dir: out, manifest: JSON.parse(readFileSync(path.join(out, 'manifest.json'), 'utf8')), sources: data };
}
