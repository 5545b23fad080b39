// runtime/decode-form.js: which decode form the warm-up chooses. Run: node --test tests/js/
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { decodeRequest, fixedChoice, measureForms, requestedForm } from '../../webbuild/template/runtime/decode-form.js';

describe('decode form', () => {
  it('measures the forms alternated and takes the faster one', async () => {
    const order = [];
    const perToken = { captured: 30, plain: 15 }; // the H100's captured replay, twice the plain steps' time
    const choice = await measureForms(async (form, tokens) => {
      order.push(form);
      return Array.from({ length: tokens }, (_, i) => perToken[form] + (i % 3)); // a little jitter per step
    }, { tokens: 8, rounds: 4, decisive: 3 });
    assert.deepEqual(order, ['captured', 'plain', 'plain', 'captured', 'captured', 'plain', 'plain', 'captured']);
    assert.equal(choice.form, 'plain');
    assert.deepEqual([choice.captured_ms, choice.plain_ms, choice.rounds, choice.tokens], [31, 16, 4, 8]);
    assert.equal(choice.why, 'measured at load');
  });

  it('stops after a round where one form is decisively faster, and measures on where they are close', async () => {
    const times = (perToken) => async (form, tokens) => new Array(tokens).fill(perToken[form]);
    const clear = await measureForms(times({ captured: 30, plain: 15 }), { tokens: 4, rounds: 2 }); // the H100's 2x
    assert.deepEqual([clear.form, clear.rounds], ['plain', 1]);
    const close = await measureForms(times({ captured: 10, plain: 11 }), { tokens: 4, rounds: 2 });
    assert.deepEqual([close.form, close.rounds], ['captured', 2]);
    const capture = await measureForms(times({ captured: 9.8, plain: 25.4 }), { tokens: 4, rounds: 2 }); // the H200's
    assert.deepEqual([capture.form, capture.rounds], ['captured', 1]);
  });

  it('keeps capture where it is faster or as fast', async () => {
    const same = await measureForms(async (_form, tokens) => new Array(tokens).fill(10), { tokens: 4, rounds: 2 });
    assert.equal(same.form, 'captured');
    const fast = await measureForms(async (form, tokens) => new Array(tokens).fill(form === 'captured' ? 9.8 : 25.4));
    assert.equal(fast.form, 'captured');
  });

  it('takes a form asked for, and plain where nothing could be captured', () => {
    assert.equal(requestedForm('plain'), 'plain');
    assert.equal(requestedForm('captured'), 'captured');
    assert.equal(requestedForm('fast'), 'auto');
    assert.equal(requestedForm(null), 'auto');
    assert.deepEqual(fixedChoice('plain', true, 'asked for'), { form: 'plain', requested: 'plain', why: 'asked for' });
    assert.equal(fixedChoice('auto', true, 'not measured on a software GPU').form, 'captured');
    assert.equal(fixedChoice('captured', false, 'no step form').form, 'plain');
  });

  it('asks for a kept choice only on its GPU and model, and measures a software GPU only when asked', () => {
    const known = { form: 'plain', requested: 'auto', why: 'measured at load', gpu: 'nvidia', model: 'm' };
    const at = { software: false, gpu: 'nvidia', model: 'm' };
    assert.deepEqual(decodeRequest({ ...at, known }), { gpu: 'nvidia', model: 'm', form: 'plain', why: 'measured on an earlier visit', measure: true });
    assert.equal(decodeRequest({ ...at, known, gpu: 'amd' }).form, 'auto');
    assert.equal(decodeRequest({ ...at, known, model: 'other' }).form, 'auto');
    assert.equal(decodeRequest({ ...at, known, decodeForm: 'captured' }).form, 'captured'); // ?decode= wins
    assert.equal(decodeRequest({ ...at, known, graphCapture: false }).form, 'plain');
    assert.equal(decodeRequest({ ...at, software: true }).measure, false);
    assert.equal(decodeRequest({ ...at, software: true, decodeForm: 'measure' }).measure, true);
  });
});

describe('WebGPU provider entry', () => {
  it("takes onnxruntime-web's validation modes it knows and the default for anything else", async () => {
    const { webgpuProvider } = await import('../../webbuild/template/runtime/probe.js');
    assert.deepEqual(await webgpuProvider(null, 'wgpuOnly'), { name: 'webgpu', validationMode: 'wgpuOnly' });
    assert.deepEqual(await webgpuProvider(null, '<script>'), { name: 'webgpu', validationMode: 'basic' });
    assert.deepEqual(await webgpuProvider(null), { name: 'webgpu', validationMode: 'basic' });
  });
});
