func.func @tiny(%x: tensor<?x256xbf16>, %wr: tensor<4x256xbf16>, %w13: tensor<4x256x256xbf16>, %w2: tensor<4x256x128xbf16>) -> tensor<?x256xbf16> {
  %out = moe.layer %x router(%wr) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 256, intermediate = 128, router = #moe.router<kind = softmax_topk, renormalize = true>, activation = #moe.activation<kind = swiglu>, quant = #moe.quant<kind = fp8_block128>>}
      : (tensor<?x256xbf16>, tensor<4x256xbf16>, tensor<4x256x256xbf16>, tensor<4x256x128xbf16>) -> tensor<?x256xbf16>
  return %out : tensor<?x256xbf16>
}
