func.func @gqa_causal(%q: tensor<2x100x8x64xbf16>, %k: tensor<2x300x2x64xbf16>, %v: tensor<2x300x2x64xbf16>) -> tensor<2x100x8x64xbf16> {
  %o = moe.attention %q, %k, %v {causal} : (tensor<2x100x8x64xbf16>, tensor<2x300x2x64xbf16>, tensor<2x300x2x64xbf16>) -> tensor<2x100x8x64xbf16>
  return %o : tensor<2x100x8x64xbf16>
}
