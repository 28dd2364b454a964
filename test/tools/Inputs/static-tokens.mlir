// A layer whose token count is fixed (3), with shared experts and their gate.
module {
  func.func @static_tokens(%arg0: tensor<3x64xbf16>, %arg1: tensor<8x64xbf16>, %arg2: tensor<8x64x64xbf16>, %arg3: tensor<8x64x32xbf16>, %arg4: tensor<96x64xbf16>, %arg5: tensor<64x48xbf16>, %arg6: tensor<1x64xbf16>) -> tensor<3x64xbf16> {
    %0 = moe.layer %arg0 router(%arg1) experts(%arg2, %arg3) shared(%arg4, %arg5, %arg6) {config = #moe.config<experts = 8, top_k = 2, hidden = 64, intermediate = 32, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 48, shared_gate = true>} : (tensor<3x64xbf16>, tensor<8x64xbf16>, tensor<8x64x64xbf16>, tensor<8x64x32xbf16>, tensor<96x64xbf16>, tensor<64x48xbf16>, tensor<1x64xbf16>) -> tensor<3x64xbf16>
    return %0 : tensor<3x64xbf16>
  }
}

