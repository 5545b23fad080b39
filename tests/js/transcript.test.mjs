// app/transcript.js: subtitle timestamps and cue files; runtime/tokens.js: the answer's language. Run: node --test tests/js/
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { cues, timestamp, toSrt, toVtt, transcriptFile } from '../../webbuild/template/app/transcript.js';
import { answerLanguage, answerText } from '../../webbuild/template/runtime/tokens.js';

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

  it('names the language in a WebVTT comment block before the cues, and nowhere in SRT', () => {
    const list = cues(['one two'], [[0, 24000]], 16000);
    assert.equal(transcriptFile('vtt', 'one two', list, 'English').body,
      'WEBVTT\n\nNOTE language: English\n\n00:00:00.000 --> 00:00:01.500\none two\n');
    assert.equal(transcriptFile('srt', 'one two', list, 'English').body, toSrt(list));
    assert.equal(toVtt(list, null), toVtt(list));
  });
});

describe('the answer\'s language (runtime/tokens.js)', () => {
  const answer = { text_start: '<asr_text>', end: '<|im_end|>' };
  it('reads the name the answer opens with, as webbuild.reference.prompt.parse_language does', () => {
    assert.equal(answerLanguage('language English<asr_text>one two<|im_end|>', answer), 'English');
    assert.equal(answerLanguage('language Chinese<asr_text>你好', answer), 'Chinese');
    assert.equal(answerLanguage('language Engl', answer), null); // streaming: no name before the text marker
    assert.equal(answerLanguage('language None<asr_text><|im_end|>', answer), null); // no speech heard
    assert.equal(answerLanguage('one two', answer), null);
    assert.equal(answerText('language English<asr_text>one two<|im_end|>', answer), 'one two');
  });
});
