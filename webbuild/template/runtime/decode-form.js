// Which decode form runs on this GPU: the captured replay of the step form (capture.js) or plain steps.
// Neither wins everywhere: with onnxruntime's GroupQueryAttention in the step (model.yaml fusion.step_attention: gqa)
// a captured step's decode attention dispatches indirectly, and Chromium's Dawn validates each indirect dispatch with
// a pass of its own (0.4 ms of GPU wait or more each, one a layer), so on an H100 the captured steps took twice the
// plain steps' time per token; with the default step attention (written out, every kernel dispatched directly) they
// took 0.4x it there (BENCHMARKS.md, "0.6b on the H100 and the H200: the step attention written out"). So the warm-up
// measures both on the visitor's GPU, alternated (A B, and B A unless the first round already told them apart), and
// the faster one decodes; the page keeps the choice per browser profile (app/decode-choice.js) and hands it back on
// the next visit, which then measures nothing (decodeRequest).

/** @typedef {'captured' | 'plain'} DecodeForm */
/**
 * What decodes and why: `form`, for a measured choice the median ms per token of each form over `rounds`, and the
 * GPU (its description) and model (manifest model_id) it was chosen for.
 * @typedef {{form: DecodeForm, requested: string, why: string, captured_ms?: number, plain_ms?: number,
 *   rounds?: number, tokens?: number, gpu?: string, model?: string}} DecodeChoice
 */

export const FORMS = /** @type {const} */ (['captured', 'plain']);
const MEASURE_TOKENS = 8; // steps per measured decode: past the first step's read-back, few enough for a load
const MEASURE_ROUNDS = 2; // A B, B A
// after a round, a form this many times faster than the other is chosen without the next rounds: on the H100 the
// first round's ratio was 1.3-2.0 (captured against plain), and a round there costs about half a second of the load
const DECISIVE = 1.3;

/**
 * What the warm-up is asked for (site.js decodeRequest): a form or 'auto', why that form, whether 'auto' may be
 * measured (not on a software GPU, unless asked), and the GPU and model a measured choice is for.
 * @typedef {{form: DecodeForm | 'auto', why: string | null, measure: boolean, gpu: string, model: string}} DecodeRequest
 */

// The request from the page's options: ?capture=0 (plain), ?decode= (a form, or 'measure'), else the choice `known`
// from an earlier visit (app/decode-choice.js) where it was made on this GPU for this model, else 'auto'.
/**
 * @param {{graphCapture?: boolean, decodeForm?: string | null, known?: DecodeChoice | null, software: boolean,
 *   gpu: string, model: string}} opts
 * @returns {DecodeRequest}
 */
export function decodeRequest({ graphCapture = true, decodeForm = null, known = null, software, gpu, model }) {
  if (!graphCapture) return { form: 'plain', why: 'asked for', measure: false, gpu, model };
  if (decodeForm) {
    return { form: requestedForm(decodeForm), why: 'asked for', measure: !software || decodeForm === 'measure', gpu, model };
  }
  const kept = known && known.gpu === gpu && known.model === model ? requestedForm(known.form) : 'auto';
  return { form: kept, why: kept === 'auto' ? null : 'measured on an earlier visit', measure: !software, gpu, model };
}

// A request as the page gives it (?decode=, or the stored choice): 'auto' unless it names a form.
/** @param {string | null | undefined} value @returns {DecodeForm | 'auto'} */
export function requestedForm(value) {
  return FORMS.includes(/** @type {DecodeForm} */ (value)) ? /** @type {DecodeForm} */ (value) : 'auto';
}

// The choice without a measurement: the form asked for, or captured where nothing was asked and capture works.
/**
 * @param {DecodeForm | 'auto'} requested
 * @param {boolean} capturable whether the step graph could be captured on this EP
 * @param {string} why why no measurement: asked for, known from an earlier visit, a software GPU; where not
 *   capturable, why not (asr.js decodeMode)
 * @returns {DecodeChoice}
 */
export function fixedChoice(requested, capturable, why) {
  if (!capturable) return { form: 'plain', requested, why };
  return { form: requested === 'auto' ? 'captured' : requested, requested, why };
}

// Decodes `tokens` steps in each form, alternated over up to `rounds` (fewer once one form is `decisive` times
// faster), through `decode(form, tokens)` (which resolves to the gaps between its tokens, ms), and chooses the form
// with the lower median per token.
/**
 * @param {(form: DecodeForm, tokens: number) => Promise<number[]>} decode
 * @param {{tokens?: number, rounds?: number, decisive?: number}} [opts]
 * @returns {Promise<DecodeChoice>}
 */
export async function measureForms(decode, { tokens = MEASURE_TOKENS, rounds = MEASURE_ROUNDS, decisive = DECISIVE } = {}) {
  /** @type {Record<DecodeForm, number[]>} */
  const gaps = { captured: [], plain: [] };
  let done = 0;
  while (done < rounds) {
    for (const form of done % 2 ? [...FORMS].reverse() : FORMS) gaps[form].push(...await decode(form, tokens));
    done++;
    const ratio = median(gaps.captured) / median(gaps.plain);
    if (ratio >= decisive || ratio <= 1 / decisive) break;
  }
  const captured = median(gaps.captured), plain = median(gaps.plain);
  const form = plain < captured ? 'plain' : 'captured';
  return { form, requested: 'auto', why: 'measured at load', captured_ms: round2(captured), plain_ms: round2(plain),
    rounds: done, tokens };
}

/** @param {number[]} xs */
function median(xs) {
  if (!xs.length) return Infinity;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** @param {number} x */
function round2(x) {
  return Math.round(x * 100) / 100;
}
