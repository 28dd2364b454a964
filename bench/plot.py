"""The README's picture, drawn from bench/results (needs matplotlib).

    python3 -m bench.plot [-o docs/performance.png]

Left: a layer's forward time against its token count (ours replayed from
its bucket's CUDA graph, PyTorch's grouped-mm layer on the same weights, and
the weight-read bound at 3.35 TB/s), from bench.latency's lines. Right: the
grouped matmul's TFLOP/s on the expert matmuls of three models, ours beside
torch._grouped_mm / torch._scaled_grouped_mm in the same run, under the
H100's dense peaks, from bench.matmul_check's lines. Each panel names the
file and commit it was drawn from.
"""
import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
LATENCY = "latency-h100-d350b1d.jsonl"
MATMUL = "matmul-h100-23ca25c.jsonl"
LAYERS = {"qwen3_30b_a3b_moe": "Qwen3-30B-A3B", "mixtral_8x7b_moe":
          "Mixtral-8x7B", "dsv3_ep8_shard": "DeepSeek-V3 EP8 shard"}
# H100 SXM dense tensor-core peaks (TFLOP/s).
PEAKS = {"bf16": 989, "fp8": 1979}


def lines(name):
    with open(os.path.join(RESULTS, name)) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def latency_panel(ax, rows):
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for (layer, title), color in zip(LAYERS.items(), colors):
        points = sorted(((r["tokens"], r) for r in rows
                         if r.get("layer") == layer and "tokens" in r
                         and r.get("label") == "new"),
                        key=lambda p: p[0])
        if not points:
            continue
        tokens = [t for t, _ in points]
        ax.plot(tokens, [r["graph_us"] for _, r in points], "-o", ms=3,
                color=color, label=f"{title}: ours")
        ax.plot(tokens, [r["peer_us"] for _, r in points], "--", color=color,
                alpha=0.7, label=f"{title}: PyTorch grouped-mm layer")
        ax.plot(tokens, [r["bound_us"] for _, r in points], ":",
                color=color, alpha=0.7, label=f"{title}: weight-read bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per forward")
    ax.set_ylabel("forward time (us), bf16")
    ax.set_title(f"MoE layer latency, H100 ({LATENCY})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=1)


def matmul_panel(ax, rows):
    shapes = []
    for r in rows:
        if r.get("what") == "time" and r["shape"] not in shapes:
            shapes.append(r["shape"])
    ours = {(r["shape"], r["scheme"]): r["tflops"] for r in rows
            if r.get("what") == "time"}
    peers = {(r["shape"], "bf16" if "bf16" in r["peer"] else "fp8"):
             r["tflops"] for r in rows if r.get("what") == "peer"}
    bars = [("ours bf16", lambda s: ours.get((s, "bf16")), "tab:blue"),
            ("torch._grouped_mm bf16", lambda s: peers.get((s, "bf16")),
             "lightsteelblue"),
            ("ours FP8 block-128", lambda s: ours.get((s, "fp8_block128")),
             "tab:red"),
            ("torch._scaled_grouped_mm FP8 rowwise",
             lambda s: peers.get((s, "fp8")), "lightsalmon")]
    width = 0.2
    for i, (label, value, color) in enumerate(bars):
        xs = [j + (i - 1.5) * width for j in range(len(shapes))]
        ax.bar(xs, [value(s) or 0 for s in shapes], width, label=label,
               color=color)
    for scheme, peak in PEAKS.items():
        ax.axhline(peak, color="gray", ls=":", lw=1)
        ax.text(-0.5, peak, f"H100 dense {scheme} peak", fontsize=6,
                ha="left", va="bottom", color="gray")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Grouped matmul, H100 ({MATMUL})", fontsize=9)
    ax.set_ylim(0, 2200)
    ax.legend(fontsize=6, loc="upper right", bbox_to_anchor=(1, 0.88))
    ax.grid(True, axis="y", alpha=0.3)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-o", default=os.path.join(HERE, "..", "docs",
                                               "performance.png"))
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    latency_panel(left, lines(LATENCY))
    matmul_panel(right, lines(MATMUL))
    fig.tight_layout()
    fig.savefig(args.o, dpi=110)
    print(f"wrote {args.o}")


if __name__ == "__main__":
    main()
