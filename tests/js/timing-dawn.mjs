// Helper of timing.test.mjs, run in its own process with the Vulkan driver's environment (SwiftShader):
// a stand-in session whose run() records one compute pass of 3 dispatches (two pipelines, one dynamic
// offset), submits it and reads the result back, as onnxruntime-web's run() does, decoded N steps under
// timing.mjs on real Dawn. Prints {plain, timing}: the values of an untimed decode and timing_per_token.
// With the argument `no-timestamps` the device is made without the timestamp-query feature.
import { installDawn } from '../../webbuild/tools/bench/dawn.mjs';
import { gpuTimingPerToken } from '../../webbuild/tools/bench/timing.mjs';

const N = 3;
const gpu = installDawn();
const adapter = await gpu.requestAdapter();
const timestamps = adapter.features.has('timestamp-query') && process.argv[2] !== 'no-timestamps';
const device = await adapter.requestDevice({ requiredFeatures: timestamps ? ['timestamp-query'] : [] });
const U = GPUBufferUsage;
const data = device.createBuffer({ size: 512, usage: U.STORAGE | U.COPY_SRC | U.COPY_DST });
const read = device.createBuffer({ size: 4, usage: U.MAP_READ | U.COPY_DST });
const layout = device.createBindGroupLayout({ entries: [
  { binding: 0, visibility: GPUShaderStage.COMPUTE, buffer: { type: 'storage', hasDynamicOffset: true } }] });
const pipeline = (label, expr) => device.createComputePipeline({
  label, layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
  compute: { entryPoint: 'main', module: device.createShaderModule({ code:
    `@group(0) @binding(0) var<storage, read_write> x: array<u32, 4>;\n@compute @workgroup_size(1) fn main() { x[0] = ${expr}; }` }) },
});
const [double, inc] = [pipeline('double', 'x[0] * 2u'), pipeline('inc', 'x[0] + 1u')];
const group = device.createBindGroup({ layout, entries: [{ binding: 0, resource: { buffer: data, size: 16 } }] });

const session = {
  async run() { // x <- (2x + 1) * 2 at offset 256, copied to `read` and read back
    const e = device.createCommandEncoder();
    const pass = e.beginComputePass();
    pass.setBindGroup(0, group, new Uint32Array([0, 256, 0]), 1, 1);
    pass.setPipeline(double);
    pass.dispatchWorkgroups(1);
    pass.pushDebugGroup('inc');
    pass.setPipeline(inc);
    pass.dispatchWorkgroups(1);
    pass.popDebugGroup();
    pass.setPipeline(double);
    pass.dispatchWorkgroups(1);
    pass.end();
    e.copyBufferToBuffer(data, 256, read, 0, 4);
    device.queue.submit([e.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const v = new Uint32Array(read.getMappedRange())[0];
    read.unmap();
    return v;
  },
};
globalThis.__gpuTiming.watchRun(session);

async function decode(n) { // as the site's runtime: a stamp per token, the first before any step
  device.queue.writeBuffer(data, 256, new Uint32Array([1]));
  const stamps = [performance.now()];
  const ids = [];
  for (let i = 0; i < n; i++) {
    ids.push(await session.run());
    stamps.push(performance.now());
  }
  return { stamps, ids };
}

const plain = await decode(N);
console.log(JSON.stringify({ plain: plain.ids, timing: await gpuTimingPerToken(decode, plain) }));
process.exit(0);
