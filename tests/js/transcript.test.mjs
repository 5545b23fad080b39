// app/transcript.js: subtitle timestamps and cue files. Run: node --test tests/js/
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { cues, timestamp, toSrt, toVtt, transcriptFile } from '../../webbuild/template/app/transcript.js';

describe('transcript files', () => {
  it('formats times as SRT and WebVTT write them', () => {
    assert.equal(timestamp(0, ','), '00:00:00,000');
    assert.equal(timestamp(3723456.4, ','), '01:02:03,456');
    assert.equal(timestamp(59999.6, '.'), '00:01:00.000'); // rounded to the ms, carried into the minute
    assert.equal(timestamp(-3, '.'), '00:00:00.000');
  });

  it('makes one cue per chunk with text, timed by its samples', () => {
    const list = cues(['one two', '', 'three'], [[0, 24000], [24000, 32000], [32000, 56000]], 16000);
    assert.deepEqual(list, [{ start: 0, end: 1500, text: 'one two' }, { start: 2000, end: 3500, text: 'three' }]);
    assert.equal(toSrt(list), '1\n00:00:00,000 --> 00:00:01,500\none two\n\n2\n00:00:02,000 --> 00:00:03,500\nthree\n');
    assert.equal(toVtt(list), 'WEBVTT\n\n00:00:00.000 --> 00:00:01.500\none two\n\n00:00:02.000 --> 00:00:03.500\nthree\n');
    assert.deepEqual(transcriptFile('txt', 'one two three', list), { body: 'one two three\n', type: 'text/plain;charset=utf-8' });
    assert.equal(transcriptFile('vtt', '', []).body, 'WEBVTT\n\n');
  });
});
