// The decode form this browser profile measured (runtime/decode-form.js), kept in localStorage for this site's
// path: the next visit hands it back to the worker, which uses it where the GPU and the model are the same ones
// (site.js) and so measures nothing at load.

const KEY = `webbuild.decode-form:${location.pathname}`;

/** @returns {import('../runtime/decode-form.js').DecodeChoice | null} */
export function keptDecodeChoice() {
  try {
    return JSON.parse(localStorage.getItem(KEY) ?? 'null');
  } catch {
    return null; // no storage (a sandboxed frame, a privacy mode) or a damaged entry: measure again
  }
}

/** @param {import('../runtime/decode-form.js').DecodeChoice | null | undefined} choice the ready info's */
export function keepDecodeChoice(choice) {
  if (choice?.why !== 'measured at load') return;
  try {
    localStorage.setItem(KEY, JSON.stringify(choice));
  } catch {
    // storage full or refused: the next visit measures again
  }
}
