// The model's worker, watched while it loads. The worker posts a sign of life every few seconds during a load
// (worker.js ALIVE_MS) besides its progress, so silence means its thread is blocked or gone, not a long step: a
// Firefox page under load was seen to stay at 'loading' for good, its worker silent after a step. The page then
// ends that worker and starts a fresh one with the same load, once; a second stall fails the load. Before its
// first message a worker that never starts (its module never loads, without an error) is the same silence.

export const STALL_MS = 90000; // no message for this long while loading: the worker is stuck (the page's ?stall_s=)
const RESTARTS = 1; // fresh workers a load may get
const CHECK_MS = 1000;

/**
 * @typedef {object} WatchHooks
 * @property {(data: any) => void} onMessage every message of the current worker
 * @property {(e: ErrorEvent) => void} onError the current worker's error event
 * @property {(stall: {restarted: boolean, silentMs: number}) => void} onStall restarted: a fresh worker got the load
 *   again; false: the restarts are spent (the load has failed)
 * @property {number} [stallMs] STALL_MS unless a positive number is given
 */

/**
 * A worker at `url` (a module) that stands in for a Worker (postMessage), watched between load(msg) and loaded().
 * @param {URL} url @param {WatchHooks} hooks
 */
export function watchedWorker(url, hooks) {
  /** @type {Worker} */
  let worker;
  let heard = performance.now();
  /** @type {unknown} */
  let loadMsg = null;
  const stallMs = Number(hooks.stallMs) > 0 ? Number(hooks.stallMs) : STALL_MS; // ?stall_s=-1, =abc: the default
  let restarts = 0;
  let ended = false; // the restarts were spent: the next load starts a fresh worker at once
  /** @type {ReturnType<typeof setInterval> | undefined} */
  let timer;
  const start = () => {
    worker = new Worker(url, { type: 'module' });
    worker.onmessage = ({ data }) => { heard = performance.now(); hooks.onMessage(data); };
    worker.onerror = hooks.onError;
    heard = performance.now();
  };
  const stop = () => { clearInterval(timer); timer = undefined; };
  const check = () => {
    const silentMs = performance.now() - heard;
    if (silentMs < stallMs) return;
    worker.terminate();
    if (restarts >= RESTARTS) {
      ended = true;
      stop();
      hooks.onStall({ restarted: false, silentMs });
      return;
    }
    restarts += 1;
    start();
    if (loadMsg) worker.postMessage(loadMsg);
    hooks.onStall({ restarted: true, silentMs });
  };
  const watch = () => { if (!timer) timer = setInterval(check, CHECK_MS); };
  start();
  watch(); // from the start: a worker that never says a word
  return {
    /** @param {unknown} msg @param {Transferable[]} [transfer] */
    postMessage: (msg, transfer = []) => worker.postMessage(msg, transfer),
    /** @param {unknown} msg the load message: sent now, and again to a fresh worker */
    load(msg) {
      if (ended) start(); // the page's Retry after a load that stalled twice
      ended = false;
      loadMsg = msg;
      heard = performance.now();
      restarts = 0;
      worker.postMessage(msg);
      watch();
    },
    /** the load has ended (ready or failed): no more watching */
    loaded() { loadMsg = null; stop(); },
  };
}
