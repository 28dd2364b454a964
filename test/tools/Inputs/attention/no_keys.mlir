func.func @nokeys(%q: tensor<1x5x2x64xbf16>, %k: tensor<1x0x2x64xbf16>, %v: tensor<1x0x2x64xbf16>) -> tensor<1x5x2x64xbf16> {
  %o = moe.attention %q, %k, %v {causal} : (tensor<1x5x2x64xbf16>, tensor<1x0x2x64xbf16>, tensor<1x0x2x64xbf16>) -> tensor<1x5x2x64xbf16>
  return %o : tensor<1x5x2x64xbf16>
}
