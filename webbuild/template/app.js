// The page: starts the model worker (again with Retry after a failed load), shows the sample clips of
// samples.json, wires the inputs (buttons, file picker, drag-and-drop), plays the chosen clip, streams the
// transcript, copies and saves it (app/transcript.js), shows progress and metrics. The worker's messages:
// runtime/contract.js. State for tests and scripts is on window.webbuild.

import { MicRecorder, SAMPLE_RATE, decodeToMono16k } from './app/audio.js';
import { LiveView, MicFrames, intervalNote } from './app/live.js';
import { BASE_INTERVAL_MS } from './runtime/live.js';
import { renderLiveMetrics, renderMetrics, renderInfo } from './app/metrics.js';
import { isolatePage } from './app/isolation.js';
import { watchedWorker } from './app/watched-worker.js';
import { keepDecodeChoice, keptDecodeChoice } from './app/decode-choice.js';
import { clock, cues, download, showSegments, transcriptFile } from './app/transcript.js';
import { FROM_WORKER, KEEP_AUDIO, LIVE_BUTTON, LORA_PICKER, SAMPLES_FILE, TO_WORKER } from './runtime/contract.js';

/** @typedef {import('./runtime/contract.js').FromWorkerMessage} FromWorkerMessage */
/** @typedef {import('./runtime/contract.js').DoneMessage} DoneMessage */
/**
 * The handler of each message the worker sends, by its type.
 * @typedef {{[T in FromWorkerMessage['type']]: (msg: Extract<FromWorkerMessage, {type: T}>) => void}} Handlers
 */
/**
 * The live mode's state (webbuild verify and the tests read it): its finals by chunk, the open chunk's partial,
 * every update (contract.js LiveUpdate), and once stopped the metrics and each chunk's [start, end).
 * @typedef {{status: string, rate: number, finals: string[], partial: string, updates: object[], metrics: object | null,
 *   chunks?: Array<[number, number]>}} LiveState
 */
/** @typedef {{id: string, src: string, text: string, label: string}} Sample  a clip of samples.json (render.py writes it) */
/** @typedef {import('./app/transcript.js').Format} Format */

// the page's elements by id (index.html.j2 has every one)
const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
const params = new URLSearchParams(location.search);
// lora: the LoRA adapter the next transcription runs with (null: the base model); doneLora: the one the last ran with;
// texts and chunks: the last transcript's text and [start, end) (16 kHz samples) per chunk, the subtitles' cues;
// clip: the src of the audio element (the chosen clip's object URL), stages: each loading step the page showed
/**
 * What the page shows, on window.webbuild for tests and scripts (webbuild verify reads it).
 * cached: the model's cache writes are over, kept: the model is in the browser's cache then; errorDetail: the last
 * error as thrown (model files by their shard names); cancelled: the last transcription was stopped by Cancel;
 * language: the language the last transcript's answer named (the forced one where the picker forced one);
 * chunk: the transcription's chunk under way ({index, count}); recovered: the model was loaded again after the GPU
 * device was lost; warningCodes: each of `warnings`' code and shard (WarningMessage's; '' and null where it has none),
 * for scripts, as the wording is the visitor's and may change.
 * @type {{status: string, cached: boolean, kept: boolean | null, info: import('./runtime/contract.js').ReadyInfo | null,
 *   metrics: object | null, text: string, tokens: number[][] | null, margins: number[][] | null, error: string | null,
 *   errorDetail: string | null, warnings: string[], warningCodes: Array<{code: string, shard: string | null}>,
 *   lora: string | null, doneLora: string | null, progress?: object,
 *   live: LiveState | null, texts: string[], chunks: Array<[number, number]>, clip: string | null, stages: string[],
 *   cancelled: boolean, chunk: {index: number, count: number} | null, recovered: boolean, language: string | null}}
 */
const state = { status: 'loading', cached: false, kept: null, info: null, metrics: null, text: '', tokens: null, margins: null,
  error: null, errorDetail: null, warnings: [], warningCodes: [], lora: null, doneLora: null, live: null, texts: [], chunks: [],
  clip: null, stages: [], cancelled: false, chunk: null, recovered: false, language: null };
/** @type {Window & {webbuild?: typeof state}} */ (window).webbuild = state;
await isolatePage(); // cross-origin isolation (wasm threads) first: the first visit may reload for it
const worker = watchedWorker(new URL('./worker.js', import.meta.url), {
  onMessage: (/** @type {FromWorkerMessage} */ data) => /** @type {(msg: FromWorkerMessage) => void} */ (handlers[data.type])?.(data),
  onError: (e) => fail(`the model worker failed to start (${e.message || 'script error'})`),
  onStall: stalled,
  stallMs: Number(params.get('stall_s')) * 1000, // ?stall_s=S: how long a loading worker may say nothing
});
/** @type {{id: number, resolve: (msg: DoneMessage) => void, reject: (e: Error) => void, seconds: number} | null} */
let pending = null; // the transcription in flight (seconds: its audio's length)
/** @type {{id: number, name: string | null} | null} */
let switching = null; // the adapter switch in flight
/**
 * The live transcription under way (app/live.js); state.live shows it for tests and scripts.
 * @type {{id: number, mic: MicFrames, view: LiveView, done?: (msg: import('./runtime/contract.js').LiveDoneMessage) => void} | null}
 */
let living = null;
let nextId = 1;

/** @type {string | undefined} */
let noticeCode; // the code of the warning the notice shows ('retry': stale once the load has ended)
const warn = (/** @type {string} */ message, /** @type {string} */ code = '', /** @type {string | null} */ shard = null) => {
  state.warnings.push(message);
  state.warningCodes.push({ code, shard });
  showNotice(message);
  noticeCode = code;
};
const samplesShown = showSamples().catch((e) => warn(`the sample clips could not be loaded (${e.message})`));
/** @type {Handlers} */
const handlers = {
  [FROM_WORKER.progress]: showProgress,
  [FROM_WORKER.alive]: () => {}, // the watch's sign of life (app/watched-worker.js): heard is enough
  [FROM_WORKER.warning]: (w) => warn(w.message, w.code, w.shard),
  [FROM_WORKER.ready]: async ({ info }) => {
    worker.loaded();
    await samplesShown; // their buttons exist before the page says it is ready
    Object.assign(state, { status: 'ready', info });
    hideProgress();
    clearRetryNotice();
    setStatus(`Ready: the ${info.variant} model runs on ${info.ep === 'webgpu' ? 'the GPU (WebGPU)' : 'the CPU (WebAssembly)'}.`);
    if (info.notice) showNotice(info.notice);
    renderInfo(info);
    keepDecodeChoice(info.decodeChoice);
    showLoraPicker(info.loraAdapters ?? [], info.loraAbout ?? {});
    showLanguagePicker(info.languages ?? [], info.language ?? 'auto');
    showContextField(info.takesContext ?? false, info.context ?? '');
    setEnabled(true);
  },
  [FROM_WORKER.cached]: ({ kept }) => { // the cache writes are over (after ready)
    Object.assign(state, { cached: true, kept });
    $('m-stored').textContent = kept ? 'yes: the next visit reads it from this browser' : 'no: the next visit downloads it again';
  },
  [FROM_WORKER.recovered]: recovered,
  [FROM_WORKER.chunk]: showChunk,
  [FROM_WORKER.token]: ({ id, text }) => { if (pending?.id === id) showText(text); },
  [FROM_WORKER.done]: (msg) => { if (pending && pending.id === msg.id) pending.resolve(msg); },
  [FROM_WORKER.cacheCleared]: ({ existed }) => setStatus(existed
    ? 'The stored model was removed from this browser; the next visit downloads it again.'
    : 'No stored model to remove.'),
  [FROM_WORKER.loraSet]: loraSet,
  [FROM_WORKER.liveUpdate]: ({ id, update }) => { if (living?.id === id) showLive(update); },
  [FROM_WORKER.liveDone]: (msg) => { if (living?.id === msg.id) living.done?.(msg); },
  [FROM_WORKER.error]: (msg) => {
    state.errorDetail = msg.detail ?? null;
    if (msg.detail && msg.detail !== msg.message) console.warn(`[webbuild] ${msg.detail}`); // the model files' shard names
    if (switching?.id === msg.id && msg.id) loraFailed(msg.message);
    else if (living?.id === msg.id && msg.id) liveFailed(msg.message);
    else if (pending && pending.id === msg.id && msg.id) pending.reject(new Error(msg.message));
    else fail(msg.message);
  },
};

const manifestUrl = new URL('model/manifest.json', location.href).href;
loadModel();
wireInputs();

// Asks the worker for the model: at the start, and again from the Retry button after a failed load.
function loadModel() {
  // ?capture=0: every decode step plain, without graph capture (runtime/capture.js); ?decode=captured|plain: that
  // decode form, else the one this profile measured on an earlier visit, else measured now (runtime/decode-form.js)
  // ?threads=N: the wasm EP's threads (the bench's --threads), else runtime/site.js wasmThreads' rule
  worker.load({ type: TO_WORKER.load, manifestUrl, forceEp: params.get('ep'),
    threads: Number(params.get('threads')) || undefined, graphCapture: params.get('capture') !== '0',
    // ?warm=shapes: every shape class warmed on a software GPU too; ?warm=decode: all but the longest chunk's
    warmShapes: ['shapes', 'decode'].includes(params.get('warm') ?? ''), warmLong: params.get('warm') !== 'decode',
    decodeForm: params.get('decode'), knownDecode: keptDecodeChoice(),
    // ?runs=whole|chunked: a WebGPU prompt in one prefill run, or in the build's runs, without the warm-up's check
    prefillRuns: params.get('runs'),
    gpuValidation: /** @type {import('./runtime/probe.js').GpuValidation | null} */ (params.get('gpu_validation')),
    // ?opt=disabled|basic|extended|all: onnxruntime's graph optimizations as each session is made (default all)
    optimization: params.get('opt'),
    // ?weights=shared: on WebGPU the decoder's weights uploaded once for its sessions (runtime/weights.js)
    weights: params.get('weights') });
  setStatus('Loading the model…');
}

// The worker said nothing for a while during the load (app/watched-worker.js): a fresh one loads again, or, where
// the fresh one stalls too, the load fails; both name the step the page last showed.
/** @param {{restarted: boolean, silentMs: number}} stall */
function stalled({ restarted, silentMs }) {
  const where = `nothing for ${Math.round(silentMs / 1000)} s after "${state.stages.at(-1) ?? 'the start'}"`;
  if (restarted) warn(`The model's worker stopped answering (${where}); it was started again.`, 'worker-restarted');
  else fail(`the model's worker stopped answering (${where}), again after a restart; reload the page to try again`);
}

function retryLoad() {
  $('retry').hidden = true;
  clearError();
  Object.assign(state, { status: 'loading', error: null });
  loadModel();
}

// One button per sample clip of samples.json (the build's list; webbuild verify clicks them by id).
async function showSamples() {
  const res = await fetch(new URL(SAMPLES_FILE, location.href));
  if (!res.ok) throw new Error(`${SAMPLES_FILE}: HTTP ${res.status}`);
  const { samples } = /** @type {{samples: Sample[]}} */ (await res.json());
  for (const sample of samples) {
    // its name, then the words it says (what the transcript should read)
    const button = Object.assign(document.createElement('button'), { type: 'button', className: 'sample', id: sample.id, disabled: true });
    button.append(Object.assign(document.createElement('span'), { className: 'sample-name', textContent: sample.label }),
      Object.assign(document.createElement('span'), { className: 'sample-text', textContent: `“${sample.text}”` }));
    button.addEventListener('click', () => runSample(sample));
    $('samples').append(button);
  }
  $('samples').hidden = !samples.length;
}

function wireInputs() {
  const input = /** @type {HTMLInputElement} */ ($('file'));
  input.addEventListener('change', async () => {
    const file = input.files?.[0];
    if (file) await runFile(file);
    input.value = '';
  });
  wireDrop();
  $('retry').addEventListener('click', retryLoad);
  $('cancel').addEventListener('click', cancel);
  $('copy').addEventListener('click', copyText);
  for (const format of /** @type {Format[]} */ (['txt', 'srt', 'vtt'])) $(`save-${format}`).addEventListener('click', () => save(format));
  $('clear-cache').addEventListener('click', () => worker.postMessage({ type: TO_WORKER.clearCache }));
  $(LIVE_BUTTON).addEventListener('click', () => (living ? stopLive() : startLive()));
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
    $('clip-row').hidden = true; // the clip shown was another's
    inputs(`button.sample, #file, #${LIVE_BUTTON}`).forEach((el) => { el.disabled = true; }); // one input at a time
    button.setAttribute('aria-pressed', 'true');
    button.textContent = 'Stop and transcribe';
    setStatus('Recording… press the button again to stop.');
  });
}

// Live transcription: the microphone's frames to the worker as they come; its texts shown as they are made.
async function startLive() {
  clearError();
  $('expected').hidden = true;
  $('clip-row').hidden = true;
  const id = nextId++;
  const mic = new MicFrames(params.get(KEEP_AUDIO) === '1');
  living = { id, mic, view: new LiveView() };
  setEnabled(false);
  try {
    await mic.start((rate) => worker.postMessage({ type: TO_WORKER.liveStart, id, rate, context: contextText(), language: pickedLanguage() }),
      (frames, capturedAt) => worker.postMessage({ type: TO_WORKER.liveAudio, id, frames, capturedAt }, [frames.buffer]));
  } catch (e) {
    living = null;
    showError(e.message);
    setEnabled(true); // the file and the samples stay usable
    return;
  }
  /** @type {Window & {webbuildLiveAudio?: () => string}} */ (window).webbuildLiveAudio = () => mic.audio();
  Object.assign(state, { status: 'listening', text: '', metrics: null, tokens: null, margins: null, texts: [], chunks: [] });
  transcriptActions(false);
  state.live = { status: 'listening', rate: mic.rate, finals: [], partial: '', updates: [], metrics: null };
  showLiveText();
  const button = $(LIVE_BUTTON);
  Object.assign(button, { disabled: false, textContent: 'Stop live transcription' });
  button.setAttribute('aria-pressed', 'true');
  const ep = state.info?.ep ?? 'wasm';
  setStatus(`Listening… ${intervalNote(BASE_INTERVAL_MS[ep], ep)}.`);
}

async function stopLive() {
  if (!living) return;
  const current = living;
  const button = /** @type {HTMLButtonElement} */ ($(LIVE_BUTTON));
  button.disabled = true;
  await current.mic.stop();
  const done = new Promise((resolve) => { current.done = resolve; });
  worker.postMessage({ type: TO_WORKER.liveStop, id: current.id });
  setStatus('Finishing the last sentence…');
  const msg = /** @type {import('./runtime/contract.js').LiveDoneMessage} */ (await done);
  living = null;
  Object.assign(state, { status: 'done', text: msg.text, tokens: msg.tokens, margins: msg.margins,
    texts: current.view.finals, chunks: msg.chunks });
  Object.assign(/** @type {object} */ (state.live), { status: 'done', metrics: msg.metrics, chunks: msg.chunks });
  showLiveText(current.view);
  transcriptActions(Boolean(msg.text));
  renderLiveMetrics(msg.metrics);
  endLive();
  setStatus(`Done: ${(msg.metrics.audio_ms / 1000).toFixed(1)} s of live audio in ${msg.metrics.chunks} chunk${msg.metrics.chunks === 1 ? '' : 's'}.`);
}

/** @param {string} message */
function liveFailed(message) {
  const current = living;
  living = null;
  current?.mic.stop();
  endLive();
  showError(message);
  setStatus('Ready.');
}

function endLive() {
  const button = $(LIVE_BUTTON);
  button.setAttribute('aria-pressed', 'false');
  button.textContent = 'Live transcription';
  setEnabled(true);
}

/** @param {import('./runtime/contract.js').LiveUpdate} update */
function showLive(update) {
  if (!living || !state.live) return;
  living.view.add(update);
  Object.assign(state.live, { finals: living.view.finals, partial: living.view.partial, updates: living.view.updates });
  showLiveText(living.view);
  if (!update.final) setStatus(`Listening… ${intervalNote(update.intervalMs, state.info?.ep ?? 'wasm')}.`);
}

// The finals as text, the open chunk's partial after them in a muted span.
/** @param {LiveView} [view] */
function showLiveText(view = new LiveView()) {
  const partial = Object.assign(document.createElement('span'), { className: 'partial', textContent: view.partial });
  const finals = view.finalText;
  $('transcript').replaceChildren(document.createTextNode(finals && view.partial ? `${finals} ` : finals), partial);
  state.text = [finals, view.partial].filter(Boolean).join(' ');
}

/** @param {Sample} sample */
async function runSample(sample) {
  $('expected').hidden = false;
  $('expected').textContent = `Expected: ${sample.text}`;
  await run(`sample “${sample.label}”`, async () => {
    const res = await fetch(sample.src);
    if (!res.ok) throw new Error(`could not load ${sample.src} (HTTP ${res.status})`);
    const blob = await res.blob();
    showClip(blob, `Sample “${sample.label}”`);
    return decodeClip(blob, sample.src);
  }, true);
}

/** @param {File} file */
async function runFile(file) {
  showClip(file, `“${file.name}”`);
  await run(`“${file.name}”`, () => decodeClip(file, file.name));
}

// The clip shown in the player as 16 kHz PCM; one that cannot be decoded takes its player away (it would play nothing).
/** @param {Blob} blob @param {string} name */
async function decodeClip(blob, name) {
  try {
    return await decodeToMono16k(await blob.arrayBuffer(), name);
  } catch (e) {
    hideClip();
    throw e;
  }
}

// A file dropped on the audio panel is transcribed as a chosen one (while the inputs are enabled).
function wireDrop() {
  const zone = $('drop');
  const ready = () => !(/** @type {HTMLInputElement} */ ($('file')).disabled);
  zone.addEventListener('dragover', (e) => {
    e.preventDefault(); // allows the drop
    if (e.dataTransfer) e.dataTransfer.dropEffect = ready() ? 'copy' : 'none';
    zone.classList.toggle('dropping', ready());
  });
  zone.addEventListener('dragleave', () => zone.classList.remove('dropping'));
  zone.addEventListener('drop', async (e) => {
    e.preventDefault(); // else the browser opens the file in place of the page
    zone.classList.remove('dropping');
    const file = e.dataTransfer?.files[0];
    if (!file || !ready()) return;
    await runFile(file);
  });
}

// The chosen clip in the audio element, to hear what is transcribed (an object URL of its bytes).
/** @param {Blob} blob @param {string} name */
function showClip(blob, name) {
  if (!blob.size) return hideClip(); // nothing to play (and Chromium logs its empty object URL's load as an error)
  const audio = /** @type {HTMLAudioElement} */ ($('clip'));
  if (state.clip) URL.revokeObjectURL(state.clip);
  state.clip = audio.src = URL.createObjectURL(blob);
  $('clip-name').textContent = `${name}:`;
  $('clip-row').hidden = false;
}

function hideClip() {
  const audio = /** @type {HTMLAudioElement} */ ($('clip'));
  if (state.clip) URL.revokeObjectURL(state.clip);
  state.clip = null;
  audio.removeAttribute('src');
  audio.load(); // forgets the clip's duration
  $('clip-row').hidden = true;
}

// The segments' times seek the player, where the transcribed clip is in it (not after a recording).
/** @param {number} seconds */
function seek(seconds) {
  const audio = /** @type {HTMLAudioElement} */ ($('clip'));
  audio.currentTime = seconds;
  audio.play().catch(() => {}); // a browser that refuses to play without a gesture still moves the position
}

async function copyText() {
  try {
    await navigator.clipboard.writeText(state.text);
    setStatus('The transcript was copied.');
  } catch (e) {
    showError(`the transcript could not be copied (${e.message}); select it and copy it by hand`);
  }
}

// The last transcript as a file: .txt, or subtitles with a cue per chunk (app/transcript.js).
/** @param {Format} format */
function save(format) {
  const { body, type } = transcriptFile(format, state.text, cues(state.texts, state.chunks, SAMPLE_RATE), state.language);
  download(`transcript.${format}`, body, type);
}

// The transcript's copy and download buttons: usable once there is a transcript.
/** @param {boolean} on */
function transcriptActions(on) {
  inputs('#transcript-actions button').forEach((el) => { el.disabled = !on; });
}

// One transcription: get PCM, send it to the worker, stream the text, show the metrics.
/**
 * @param {string} what the audio, for the status line
 * @param {() => Promise<Float32Array>} getPcm
 * @param {boolean} [keepExpected] leave the sample's expected text shown
 */
async function run(what, getPcm, keepExpected = false) {
  if (!keepExpected) $('expected').hidden = true;
  clearError();
  setEnabled(false);
  Object.assign(state, { status: 'transcribing', text: '', metrics: null, tokens: null, margins: null, texts: [], chunks: [],
    cancelled: false, chunk: null, language: null });
  transcriptActions(false);
  showText('');
  showLanguage(null);
  setStatus(`Transcribing ${what}…`);
  try {
    const pcm = await getPcm();
    if (!pcm.length) throw new Error('the audio is empty');
    const done = await /** @type {Promise<DoneMessage>} */ (new Promise((resolve, reject) => {
      pending = { id: nextId++, resolve, reject, seconds: pcm.length / SAMPLE_RATE };
      const maxNewTokens = Number(params.get('max_new_tokens')) || undefined;
      const chunkSeconds = Number(params.get('chunk_seconds')) || undefined; // models trained on short clips
      const language = pickedLanguage();
      const context = contextText();
      worker.postMessage({ type: TO_WORKER.transcribe, id: pending.id, pcm, maxNewTokens, chunkSeconds, language, context }, [pcm.buffer]);
      Object.assign($('cancel'), { hidden: false, disabled: false });
    }));
    Object.assign(state, { status: 'done', text: done.text, tokens: done.tokens, margins: done.margins, metrics: done.metrics,
      doneLora: done.lora, texts: done.texts, chunks: done.chunks, cancelled: done.cancelled, language: done.language });
    showLanguage(done.text ? done.language : null);
    showText(done.text || '(no speech recognised)');
    if (done.text) showSegments($('transcript'), cues(done.texts, done.chunks, SAMPLE_RATE), $('clip-row').hidden ? null : seek);
    transcriptActions(Boolean(done.text));
    renderMetrics(done.metrics);
    const seconds = (done.metrics.audio_ms / 1000).toFixed(1);
    setStatus(done.cancelled
      ? `Cancelled after ${seconds} s of the audio's ${pending?.seconds.toFixed(1)} s (chunk ${done.chunks.length} of ` +
        `${done.audioChunks}, perhaps cut short); the transcript so far is kept.`
      : `Done: ${seconds} s of audio in ${(done.metrics.total_ms / 1000).toFixed(2)} s.`);
  } catch (e) {
    state.status = 'ready';
    showError(e.message);
    setStatus('Ready.');
  } finally {
    pending = null;
    $('cancel').hidden = true;
    hideProgress();
    setEnabled(true);
  }
}

// Cancel: the worker stops after the current chunk's decode step and answers with the transcript so far.
function cancel() {
  if (!pending) return;
  worker.postMessage({ type: TO_WORKER.cancel, id: pending.id });
  /** @type {HTMLButtonElement} */ ($('cancel')).disabled = true;
  setStatus('Cancelling: the transcription stops once its current chunk or step is done…');
}

// A long file's progress: the chunk under way of how many, and where it starts in the audio.
/** @param {import('./runtime/contract.js').ChunkMessage} msg */
function showChunk({ id, index, count, start }) {
  if (pending?.id !== id) return;
  state.chunk = { index, count };
  const bar = /** @type {HTMLProgressElement} */ ($('progress'));
  Object.assign(bar, { hidden: false, max: count, value: index });
  const at = `${clock(start / SAMPLE_RATE)} of ${clock(pending.seconds)}`;
  $('progress-text').textContent = `Chunk ${index + 1} of ${count} (from ${at} of the audio)`;
  if (!(/** @type {HTMLButtonElement} */ ($('cancel')).disabled)) setStatus(`Transcribing chunk ${index + 1} of ${count}…`);
}

// The model loaded again after the GPU device was lost (the 'device-lost' warning said so): now on the CPU.
/** @param {import('./runtime/contract.js').RecoveredMessage} msg */
function recovered({ info }) {
  Object.assign(state, { info, recovered: true });
  renderInfo(info);
  warn(`The GPU stopped working, so the model was loaded again and now runs on the CPU (WebAssembly), which is slower.${
    pending ? ' The transcription goes on from the chunk it was in; the text before it is kept.' : ''}`, 'device-lost');
  if (pending) return; // its chunk messages say where it is
  hideProgress();
  setStatus(`Ready: the ${info.variant} model runs on the CPU (WebAssembly).`);
}

// Loading in its three steps, each named by what it does on the chosen processor (ProgressMessage.ep); the bar
// shows the bytes while downloading, and moves without a fraction while a step reports none.
const STEPS = 3;
/** @param {import('./runtime/contract.js').ProgressMessage} e */
function progressLabel(e) {
  if (e.lora) return `Downloading the adapter “${e.lora}”`;
  const gpu = e.ep === 'webgpu';
  /** @type {Record<string, [number, string]>} */
  const steps = {
    manifest: [0, "Reading the model's list of files"], // before the three steps, unnumbered
    gpu: [0, 'Checking what this device can run'],
    download: [1, 'downloading the model'],
    verify: [1, 'downloading the model'],
    session: [2, gpu ? 'preparing the model for the GPU' : 'preparing the model for the CPU'],
    warmup: [3, gpu ? 'warming up (compiling the GPU programs)' : 'warming up (a first short run on the CPU)'],
  };
  const [step, what] = steps[e.phase] ?? [0, e.phase];
  return step ? `Step ${step} of ${STEPS}: ${what}` : what;
}

/** @param {import('./runtime/contract.js').ProgressMessage} e */
function showProgress(e) {
  const bar = /** @type {HTMLProgressElement} */ ($('progress'));
  bar.hidden = false;
  bar.max = 1;
  const label = progressLabel(e);
  state.progress = e;
  if (state.stages.at(-1) !== label) state.stages.push(label);
  if ((e.phase === 'download' || e.phase === 'verify') && e.total) {
    bar.max = e.total;
    bar.value = e.loaded;
    $('progress-text').textContent = `${mib(e.loaded)} of ${mib(e.total)} MiB`;
  } else {
    bar.removeAttribute('value'); // indeterminate (style.css animates it): this step reports no fraction
    $('progress-text').textContent = e.phase === 'download' ? '' : 'This step does not say how far along it is; the bar moves while it works.';
  }
  setStatus(`${label}…`);
}

// The adapter picker (docs/adapters.md): "none (base model)" and each adapter the worker can switch on, with
// what the chosen one is for (model.yaml's description) under it; hidden where the build ships none.
/** @param {string[]} names @param {Record<string, string>} about */
function showLoraPicker(names, about) {
  const picker = /** @type {HTMLSelectElement} */ ($(LORA_PICKER));
  if (picker.options.length > 1) return; // a retried load: the picker is made already
  for (const name of names) picker.append(Object.assign(document.createElement('option'), { value: name, textContent: name }));
  picker.value = state.lora ?? '';
  picker.disabled = false;
  $('lora-row').hidden = !names.length;
  loraAbout = { '': $('lora-about').textContent ?? '', ...about };
  picker.addEventListener('change', () => { describeLora(); switchLora(picker.value || null); });
}

// The language picker: "automatic" (the model names the language it hears) and the model's languages (runtime.json),
// on model.yaml's default; a forced one's answer prefix goes after the prompt (runtime/asr.js).
/** @param {string[]} names @param {string} chosen 'auto' or one of names */
function showLanguagePicker(names, chosen) {
  const picker = /** @type {HTMLSelectElement} */ ($('language'));
  if (picker.options.length > 1) return; // a retried load: the picker is made already
  for (const name of names) picker.append(Object.assign(document.createElement('option'), { value: name, textContent: name }));
  picker.value = names.includes(chosen) ? chosen : '';
  picker.disabled = false;
}

// The context field: text the model reads in its prompt's system message (runtime/bpe.js tokenises it in the worker),
// on model.yaml's default; shown only where the page can tokenise text for this model.
/** @param {boolean} takes @param {string} text */
function showContextField(takes, text) {
  const field = /** @type {HTMLInputElement} */ ($('context'));
  $('context-row').hidden = !takes;
  if (!takes || !field.disabled) return; // a retried load keeps what the visitor wrote
  field.value = text;
  field.disabled = false;
}

// The context text sent with a transcription or a live start ('': none).
function contextText() {
  const field = /** @type {HTMLInputElement} */ ($('context'));
  return field.disabled ? '' : field.value.trim();
}

// The language the picker forces, null for automatic ('': the model names the language it hears).
function pickedLanguage() {
  return /** @type {HTMLSelectElement} */ ($('language')).value || null;
}

// The language the transcript's answer named, beside it (null: none to show).
/** @param {string | null} language */
function showLanguage(language) {
  $('language-shown').hidden = !language;
  $('language-shown').textContent = language ? `Language: ${language}` : '';
}

/** @type {Record<string, string>} what each adapter is for ('': what an adapter is, for the base model) */
let loraAbout = {};
function describeLora() {
  const name = /** @type {HTMLSelectElement} */ ($(LORA_PICKER)).value;
  $('lora-about').textContent = loraAbout[name] ?? `The adapter “${name}”.`;
}

// Asks the worker for adapter `name` (null: the base model); the next transcription runs with it.
/** @param {string | null} name */
function switchLora(name) {
  switching = { id: nextId++, name };
  /** @type {HTMLSelectElement} */ ($(LORA_PICKER)).disabled = true;
  clearError();
  setStatus(name ? `Switching to the adapter “${name}”…` : 'Switching to the base model…');
  worker.postMessage({ type: TO_WORKER.setLora, id: switching.id, name });
}

/** @param {import('./runtime/contract.js').LoraSetMessage} msg */
function loraSet({ id, name }) {
  if (switching?.id !== id) return;
  switching = null;
  state.lora = name;
  if (state.info) state.info.lora = name;
  Object.assign($(LORA_PICKER), { value: name ?? '', disabled: false });
  hideProgress();
  setStatus(name ? `Adapter “${name}” on: the next transcription uses it.` : 'No adapter: the next transcription uses the base model.');
}

/** @param {string} message */
function loraFailed(message) {
  switching = null;
  Object.assign($(LORA_PICKER), { value: state.lora ?? '', disabled: false }); // the worker kept the previous one
  describeLora();
  $('progress').hidden = true;
  showError(`the adapter could not be switched (${message})`);
  setStatus('Ready.');
}

/** @param {boolean} on */
function setEnabled(on) {
  inputs(`button.sample, #file, #mic, #${LIVE_BUTTON}`).forEach((el) => { el.disabled = !on; });
}

// The page's buttons and file input that `selector` picks.
function inputs(/** @type {string} */ selector) {
  return /** @type {NodeListOf<HTMLButtonElement | HTMLInputElement>} */ (document.querySelectorAll(selector));
}
/** @param {string} text */
function setStatus(text) { $('status').textContent = text; }
/** @param {string} text */
function showText(text) { state.text = text; $('transcript').textContent = text; }
/** @param {string} text */
function showNotice(text) { $('notice').hidden = false; $('notice').textContent = text; }
/** @param {string} text */
function showError(text) { state.error = text; $('error').hidden = false; $('error').textContent = `Error: ${text}`; }
function clearError() { state.error = null; $('error').hidden = true; }
// A retry's notice ("trying again (2 of 5)") is stale once the load has ended, failed or not.
function clearRetryNotice() {
  if (noticeCode === 'retry') $('notice').hidden = true;
}
function hideProgress() {
  $('progress').hidden = true;
  $('progress-text').textContent = '';
}
/** @param {string} message */
function fail(message) {
  worker.loaded();
  Object.assign(state, { status: 'error', error: message });
  showError(message);
  clearRetryNotice();
  setStatus('The model could not be loaded.');
  hideProgress();
  $('retry').hidden = false;
}
const mib = (/** @type {number} */ n) => (n / 2 ** 20).toFixed(1);
