// The transcript as files: plain text, and SubRip (SRT) / WebVTT subtitles with one cue per chunk the worker
// transcribed, timed by the chunk's [start, end) in 16 kHz samples (contract.js DoneMessage, LiveDoneMessage); and on
// the page, the same cues as segments, each after its start time.

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

// With the transcript's `language`, a comment block names it: WebVTT's header is the WEBVTT line alone (W3C WebVTT,
// "WebVTT file structure": blank lines follow it, then style, region and NOTE blocks; the older drafts' metadata
// header lines are gone), and a NOTE block may come before the cues. SRT has no place for it.
/** @param {Cue[]} list @param {string | null} [language] */
export function toVtt(list, language = null) {
  const note = language ? `NOTE language: ${language}\n\n` : '';
  return `WEBVTT\n\n${note}${list.map((c) => `${timestamp(c.start, '.')} --> ${timestamp(c.end, '.')}\n${c.text.trim()}\n`).join('\n')}`;
}

// m:ss, or h:mm:ss from an hour on.
/** @param {number} seconds */
export function clock(seconds) {
  const s = Math.floor(seconds), pad = (/** @type {number} */ n) => String(n).padStart(2, '0');
  return s >= 3600 ? `${Math.floor(s / 3600)}:${pad(Math.floor(s / 60) % 60)}:${pad(s % 60)}` : `${Math.floor(s / 60)}:${pad(s % 60)}`;
}

// The cues in `el`, one segment a line after its start time. The time is the button's generated content
// (style.css: attr(data-time)), so selecting and copying the transcript gives its words alone; with `seek`
// (a player holds the transcribed clip) a time is a button that plays the clip from there.
/** @param {HTMLElement} el @param {Cue[]} list @param {((seconds: number) => void) | null} seek */
export function showSegments(el, list, seek) {
  el.replaceChildren(...list.map((c) => {
    const at = clock(c.start / 1000);
    const time = document.createElement(seek ? 'button' : 'span');
    time.className = 'time';
    time.dataset.time = at;
    if (seek) {
      Object.assign(time, { type: 'button', title: `Play from ${at}` });
      time.setAttribute('aria-label', `Play from ${at}`);
      time.addEventListener('click', () => seek(c.start / 1000));
    }
    const segment = Object.assign(document.createElement('span'), { className: 'segment' });
    segment.append(time, c.text.trim());
    return segment;
  }));
}

const TYPES = { txt: 'text/plain', srt: 'application/x-subrip', vtt: 'text/vtt' };

// The file of `format` for a transcript: its text, or its cues.
/**
 * @param {Format} format
 * @param {string} text
 * @param {Cue[]} list
 * @param {string | null} [language] the language the answer named (WebVTT's alone has a place for it)
 * @returns {{body: string, type: string}}
 */
export function transcriptFile(format, text, list, language = null) {
  const body = format === 'txt' ? `${text}\n` : format === 'srt' ? toSrt(list) : toVtt(list, language);
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
