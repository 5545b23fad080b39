"""Graph fusion for exported Qwen3-ASR (and Llama/Qwen2/Qwen3) decoders.

`fusion.fuse_decoder.fuse_decoder(src)` turns a decomposed decoder export (split dir or merged .onnx,
torchscript or dynamo, float or MatMulNBits) into one decoder graph for onnxruntime(-web):
inputs_embeds, attention_mask, past_key_values.{i}.key|value -> logits [B,1,V], present.{i}.*.
One rule per module, each a `rule.Rule` (the op types it anchors on, match -> match | Miss(reason),
rewrite) run by the one driver in `fusion.rule`; the decoder's list (`fuse.decoder_steps`, each rule
under a flag of the source or the options), in order:

  gather_block_quantized  dequantized table + Gather -> GatherBlockQuantized, the table's bytes kept
                 (before folding; shares them with a tied lm_head)
  matmul_nbits   dequantized int4/int8 weight + MatMul (or Gemm) -> MatMulNBits (before folding)
  cleanup        constant folding, CSE (not a rule: gives the rules one spelling per op)
  layer_norm     LayerNorm -> LayerNormalization (Cohere, Phi-2, StableLM, Nemotron decoders)
  rms_norm       RMSNorm -> SimplifiedLayerNormalization
  rms_normalization  opset 23's RMSNormalization -> SimplifiedLayerNormalization
  skip_rms_norm  residual Add + norm -> SkipSimplifiedLayerNormalization
  skip_layer_norm  residual Add + LayerNormalization -> SkipLayerNormalization
  gqa            attention (decomposed, or opset 23's Attention) + RoPE (any, or none) + KV concat ->
                 GroupQueryAttention (rope, attention_mask, shape_scalar helpers)
  merge_split    split layout's prefill graph -> the single decoder interface
  packed_qkv     Q/K/V projections -> one MatMul(NBits) (+ Split when Q/K norms sit between)
  qk_norm_in_gqa opt-in, WebGPU/CUDA only: Q/K norms into GQA (and back out: take_out); the build
                 applies it to its WebGPU decoders after quantization (webbuild/forms/webgpu.py)
  prune_lm_head  lm_head on the last position only
  static_reshape computed Reshape targets -> constants

`fusion.fuse_encoder.fuse_encoder(src)` does the same for the audio encoder (mel -> audio_features),
after the same cleanup (its list: `fuse_encoder.STEPS`):

  layer_norm         decomposed LayerNorm -> LayerNormalization
  gelu               Erf GELU -> Gelu
  bias_gelu          linear bias + Gelu -> BiasGelu (linear_bias: the bias of an Add or a Gemm)
  skip_layer_norm    residual Add (+ projection bias) + LayerNormalization -> SkipLayerNormalization
  encoder_attention  windowed eager attention -> MultiHeadAttention, the mask as attention_bias
  encoder_packed_qkv Q/K/V projections -> one projection + Split

The quantized-weight rules share `dequant` (the DequantizeLinear and Cast/Sub/Mul spellings, packed from
the stored bytes); the norm rules share `norm_parts`; the skip norms match with onnxscript patterns, the others are
structural (`fusion.rule` says why). `fusion.decompose` is the inverse (round-trip tests),
`fusion.parity` the onnxruntime CPU harness; `webbuild fuse` is webbuild.pipeline.fuse.run_fuse.
"""
