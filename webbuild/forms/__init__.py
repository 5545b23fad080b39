"""Graph forms: the graphs the build derives from a fused, assembled or quantized one, each declared as a
`Form` and run by one driver that reports every form it did not make (form.py). `webgpu` (the WebGPU decoder),
`wasm_twin` (the wasm EP's twin), `step` (the decode step for graph capture), `lora` (the adapted decoder and the
passes of its step form), `lora_delta` (the delta graph), `mel_frontend` (the log-mel front-end as ONNX), and
`decoder` (a decoder's shipped forms, in order)."""
