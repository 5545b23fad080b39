// The page: starts the model worker, wires the inputs, streams the transcript, shows progress
// and metrics. State for tests and scripts is on window.webbuild.

import { MicRecorder, decodeToMono16k } from './app/audio.js';
import { renderMetrics, renderInfo } from './app/metrics.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const state = (window.webbuild = { status: 'loading', info: null, metrics: null, text: '', tokens: null, error: null, warnings: [] });
const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
let pending = null; // {id, resolve, reject} of the transcription in flight
let nextId = 1;

worker.onmessage = ({ data }) => handlers[data.type]?.(data);
worker.onerror = (e) => fail(`the model worker failed to start (${e.message || 'script error'})`);
const handlers = {
  progress: showProgress,
  warning: (w) => { state.warnings.push(w.message); showNotice(w.message); },
  ready: ({ info }) => {
    Object.assign(state, { status: 'ready', info });
    $('progress').hidden = true;
    $('progress-text').textContent = '';
    setStatus(`Ready: ${info.variant} model on ${info.ep === 'webgpu' ? 'WebGPU' : 'WebAssembly (CPU)'}.`);
    if (info.notice) showNotice(info.notice);
    renderInfo(info);
    setEnabled(true);
  },
  token: ({ id, text }) => { if (pending?.id === id) showText(text); },
  done: (msg) => pending?.id === msg.id && pending.resolve(msg),
  'cache-cleared': ({ existed }) => setStatus(existed ? 'The stored model was removed from this browser; the next visit downloads it again.' : 'No stored model to remove.'),
  error: (msg) => (pending?.id === msg.id && msg.id ? pending.reject(new Error(msg.message)) : fail(msg.message)),
};

worker.postMessage({ type: 'load', manifestUrl: new URL('model/manifest.json', location.href).href, forceEp: params.get('ep') });
setStatus('Loading the model…');
wireInputs();

function wireInputs() {
  document.querySelectorAll('button.sample').forEach((b) => b.addEventListener('click', () => runSample(b)));
  $('file').addEventListener('change', async (e) => {
    const file = e.target.files[0];
    if (file) await run(`“${file.name}”`, async () => decodeToMono16k(await file.arrayBuffer()));
    e.target.value = '';
  });
  $('clear-cache').addEventListener('click', () => worker.postMessage({ type: 'clear-cache' }));
  const mic = new MicRecorder();
  $('mic').addEventListener('click', async () => {
    const button = $('mic');
    if (button.getAttribute('aria-pressed') === 'true') {
      button.setAttribute('aria-pressed', 'false');
      button.textContent = 'Record from microphone';
      await run('the recording', () => mic.stop());
      return;
    }
    try {
      await mic.start();
    } catch (e) {
      showError(e.message);
      return;
    }
    clearError();
    document.querySelectorAll('button.sample, #file').forEach((el) => { el.disabled = true; }); // one input at a time
    button.setAttribute('aria-pressed', 'true');
    button.textContent = 'Stop and transcribe';
    setStatus('Recording… press the button again to stop.');
  });
}

async function runSample(button) {
  $('expected').hidden = false;
  $('expected').textContent = `Expected: ${button.dataset.text}`;
  await run(`sample “${button.textContent}”`, async () => {
    const res = await fetch(button.dataset.src);
    if (!res.ok) throw new Error(`could not load ${button.dataset.src} (HTTP ${res.status})`);
    return decodeToMono16k(await res.arrayBuffer());
  }, true);
}

// One transcription: get PCM, send it to the worker, stream the text, show the metrics.
async function run(what, getPcm, keepExpected = false) {
  if (!keepExpected) $('expected').hidden = true;
  clearError();
  setEnabled(false);
  Object.assign(state, { status: 'transcribing', text: '', metrics: null, tokens: null });
  showText('');
  setStatus(`Transcribing ${what}…`);
  try {
    const pcm = await getPcm();
    if (!pcm.length) throw new Error('the audio is empty');
    const done = await new Promise((resolve, reject) => {
      pending = { id: nextId++, resolve, reject };
      const maxNewTokens = Number(params.get('max_new_tokens')) || undefined;
      const chunkSeconds = Number(params.get('chunk_seconds')) || undefined; // models trained on short clips
      worker.postMessage({ type: 'transcribe', id: pending.id, pcm, maxNewTokens, chunkSeconds }, [pcm.buffer]);
    });
    Object.assign(state, { status: 'done', text: done.text, tokens: done.tokens, metrics: done.metrics });
    showText(done.text || '(no speech recognised)');
    renderMetrics(done.metrics);
    setStatus(`Done: ${(done.metrics.audio_ms / 1000).toFixed(1)} s of audio in ${(done.metrics.total_ms / 1000).toFixed(2)} s.`);
  } catch (e) {
    state.status = 'ready';
    showError(e.message);
    setStatus('Ready.');
  } finally {
    pending = null;
    setEnabled(true);
  }
}

function showProgress(e) {
  const bar = $('progress');
  const label = { download: 'Downloading the model', verify: 'Downloading the model', session: 'Preparing the model', warmup: 'Warming up (compiling GPU shaders)' }[e.phase] ?? e.phase;
  state.progress = e;
  if (e.phase === 'download' || e.phase === 'verify') {
    bar.max = e.total || 1;
    bar.value = e.loaded;
    $('progress-text').textContent = `${mib(e.loaded)} of ${mib(e.total)} MiB`;
  } else {
    bar.removeAttribute('value'); // indeterminate: session creation reports no fraction
    $('progress-text').textContent = '';
  }
  setStatus(`${label}…`);
}

function setEnabled(on) {
  document.querySelectorAll('button.sample, #file, #mic').forEach((el) => { el.disabled = !on; });
}
function setStatus(text) { $('status').textContent = text; }
function showText(text) { state.text = text; $('transcript').textContent = text; }
function showNotice(text) { $('notice').hidden = false; $('notice').textContent = text; }
function showError(text) { state.error = text; $('error').hidden = false; $('error').textContent = `Error: ${text}`; }
function clearError() { state.error = null; $('error').hidden = true; }
function fail(message) {
  Object.assign(state, { status: 'error', error: message });
  showError(message);
  setStatus('The model could not be loaded.');
  $('progress').hidden = true;
}
const mib = (n) => (n / 2 ** 20).toFixed(1);
