// The MoE layer of DeepSeek-V3 (and Kimi-K2, which shares its architecture):
// 256 routed experts, 8 per token, chosen by sigmoid scores plus a
// score-correction bias within the best 4 of 8 groups, weights renormalized
// and scaled by 2.5; one shared expert of the same width.
func.func @deepseek_v3_moe(
    %hidden_states: tensor<?x7168xbf16>,
    %router_weight: tensor<256x7168xbf16>,
    %router_bias: tensor<256xf32>,
    %w13: tensor<256x4096x7168xbf16>,
    %w2: tensor<256x7168x2048xbf16>,
    %shared_w13: tensor<4096x7168xbf16>,
    %shared_w2: tensor<7168x2048xbf16>) -> tensor<?x7168xbf16> {
  %out = moe.layer %hidden_states router(%router_weight, %router_bias)
      experts(%w13, %w2) shared(%shared_w13, %shared_w2) {
      config = #moe.config<experts = 256, top_k = 8, hidden = 7168,
                           intermediate = 2048,
                           router = #moe.router<kind = sigmoid_grouped_topk,
                                                renormalize = true,
                                                n_group = 8, topk_group = 4,
                                                scaling = 2.5>,
                           activation = #moe.activation<kind = swiglu>,
                           shared_intermediate = 2048>}
      : (tensor<?x7168xbf16>, tensor<256x7168xbf16>, tensor<256xf32>,
         tensor<256x4096x7168xbf16>, tensor<256x7168x2048xbf16>,
         tensor<4096x7168xbf16>, tensor<7168x2048xbf16>)
      -> tensor<?x7168xbf16>
  return %out : tensor<?x7168xbf16>
}
