// The MoE layer of Mixtral-8x7B: 8 experts, 2 per token, softmax over the
// router logits, the two weights renormalized to sum to one; no shared expert.
func.func @mixtral_8x7b_moe(
    %hidden_states: tensor<?x4096xbf16>,
    %router_weight: tensor<8x4096xbf16>,
    %w13: tensor<8x28672x4096xbf16>,
    %w2: tensor<8x4096x14336xbf16>) -> tensor<?x4096xbf16> {
  %out = moe.layer %hidden_states router(%router_weight) experts(%w13, %w2) {
      config = #moe.config<experts = 8, top_k = 2, hidden = 4096,
                           intermediate = 14336,
                           router = #moe.router<kind = softmax_topk,
                                                renormalize = true>,
                           activation = #moe.activation<kind = swiglu>>}
      : (tensor<?x4096xbf16>, tensor<8x4096xbf16>, tensor<8x28672x4096xbf16>,
         tensor<8x4096x14336xbf16>) -> tensor<?x4096xbf16>
  return %out : tensor<?x4096xbf16>
}
