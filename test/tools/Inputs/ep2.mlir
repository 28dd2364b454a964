func.func @ep(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<2x16x8xbf16>, %w2: tensor<2x8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<2x16x8xbf16>, tensor<2x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}
