// A wait with a bound: for browser calls that may leave their promise pending for good (storage, service workers).

/**
 * `promise`, or an error (name 'TimeoutError') naming `what` once `ms` have passed without its answer (the timer
 * cleared either way).
 * @template T
 * @param {Promise<T>} promise @param {number} ms @param {string} what
 * @returns {Promise<T>}
 */
export function within(promise, ms, what) {
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error(`${what} did not answer in ${ms / 1000} s`), { name: 'TimeoutError' })), ms);
  });
  return /** @type {Promise<T>} */ (Promise.race([promise, late]).finally(() => clearTimeout(timer)));
}
