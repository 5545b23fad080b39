// The transcript as files: plain text, and SubRip (SRT) / WebVTT subtitles with one cue per chunk the worker
// transcribed, timed by the chunk's [start, end) in 16 kHz samples (contract.js DoneMessage, LiveDoneMessage).

/** @typedef {{start: number, end: number, text: string}} Cue  ms from the audio's start */
/** @typedef {'txt' | 'srt' | 'vtt'} Format */

// One cue per chunk with text (a chunk of silence has none).
/**
 * @param {string[]} texts per chunk
 * @param {Array<[number, number]>} chunks [start, end) per chunk, in samples at `rate`
 * @param {number} rate
 * @returns {Cue[]}
 */
export function cues(texts, chunks, rate) {
  return chunks.map(([start, end], i) => ({ start: (start / rate) * 1000, end: (end / rate) * 1000, text: texts[i] ?? '' }))
    .filter((c) => c.text.trim());
}

// HH:MM:SS,mmm (SRT) or HH:MM:SS.mmm (WebVTT).
/** @param {number} ms @param {string} sep */
export function timestamp(ms, sep) {
  const t = Math.max(0, Math.round(ms));
  const pad = (/** @type {number} */ n, /** @type {number} */ w = 2) => String(n).padStart(w, '0');
  return `${pad(Math.floor(t / 3600000))}:${pad(Math.floor(t / 60000) % 60)}:${pad(Math.floor(t / 1000) % 60)}${sep}${pad(t % 1000, 3)}`;
}

/** @param {Cue[]} list */
export function toSrt(list) {
  return list.map((c, i) => `${i + 1}\n${timestamp(c.start, ',')} --> ${timestamp(c.end, ',')}\n${c.text.trim()}\n`).join('\n');
}

/** @param {Cue[]} list */
export function toVtt(list) {
  return `WEBVTT\n\n${list.map((c) => `${timestamp(c.start, '.')} --> ${timestamp(c.end, '.')}\n${c.text.trim()}\n`).join('\n')}`;
}

const TYPES = { txt: 'text/plain', srt: 'application/x-subrip', vtt: 'text/vtt' };

// The file of `format` for a transcript: its text, or its cues.
/**
 * @param {Format} format
 * @param {string} text
 * @param {Cue[]} list
 * @returns {{body: string, type: string}}
 */
export function transcriptFile(format, text, list) {
  const body = format === 'txt' ? `${text}\n` : format === 'srt' ? toSrt(list) : toVtt(list);
  return { body, type: `${TYPES[format]};charset=utf-8` };
}

// Saves `body` as a download named `name` (an object URL on a temporary link).
/** @param {string} name @param {string} body @param {string} type */
export function download(name, body, type) {
  const url = URL.createObjectURL(new Blob([body], { type }));
  const link = Object.assign(document.createElement('a'), { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 0);
}
