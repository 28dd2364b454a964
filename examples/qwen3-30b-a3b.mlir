// The MoE layer of Qwen3-30B-A3B: 128 experts, 8 per token, softmax over the
// router logits, the eight weights renormalized (norm_topk_prob); no shared
// expert.
func.func @qwen3_30b_a3b_moe(
    %hidden_states: tensor<?x2048xbf16>,
    %router_weight: tensor<128x2048xbf16>,
    %w13: tensor<128x1536x2048xbf16>,
    %w2: tensor<128x2048x768xbf16>) -> tensor<?x2048xbf16> {
  %out = moe.layer %hidden_states router(%router_weight) experts(%w13, %w2) {
      config = #moe.config<experts = 128, top_k = 8, hidden = 2048,
                           intermediate = 768,
                           router = #moe.router<kind = softmax_topk,
                                                renormalize = true>,
                           activation = #moe.activation<kind = swiglu>>}
      : (tensor<?x2048xbf16>, tensor<128x2048xbf16>, tensor<128x1536x2048xbf16>,
         tensor<128x2048x768xbf16>) -> tensor<?x2048xbf16>
  return %out : tensor<?x2048xbf16>
}
