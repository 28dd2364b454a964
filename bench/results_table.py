"""Turns bench/device-check.sh's JSON lines into the Markdown tables of
bench/RESULTS.md.

    python3 -m bench.results_table bench/results/device-check-h100-COMMIT.jsonl
"""
import sys

from bench.common import read_lines

rows = read_lines(sys.argv[1])
commit = next((r["commit"] for r in rows if r["what"] == "commit"), "?")
print(f"Commit {commit}.\n")
print("| layer | tokens | reference | relative error | bound |")
print("|---|---|---|---|---|")
for r in rows:
    if r["what"] == "check" and "rel_error" in r:
        print(f"| {r['layer']} | {r['tokens']} | {r['reference']} | "
              f"{r['rel_error']:.1e} | {r['bound']:g} |")
    elif r["what"] == "check":
        print(f"| {r['layer']} | {r['tokens']} | {r['reference']} | - | - |")
times = {(r["layer"], r["tokens"]): r for r in rows if r["what"] == "time"}
peers = {(r["layer"], r["tokens"]): r for r in rows if r["what"] == "peer"}
print("\n| layer | tokens | ours (us) | TFLOP/s | torch grouped_mm layer (us) "
      "| ours / peer |")
print("|---|---|---|---|---|---|")
for key, t in times.items():
    p = peers.get(key, {})
    ratio = f"{t['us'] / p['us']:.2f}" if "us" in p else "-"
    print(f"| {key[0]} | {key[1]} | {t['us']:.0f} | {t['tflops']:.0f} | "
          f"{p.get('us', float('nan')):.0f} | {ratio} |")
print("\nPer kernel at 4096 tokens (us, mean of 3 forwards, torch.profiler):\n")
for r in rows:
    if r["what"] == "kernels":
        parts = ", ".join(f"{k} {v:.0f}" for k, v in r["us"].items())
        print(f"- {r['layer']}: {parts}")
for r in rows:
    if r["what"] == "moe-exec":
        print(f"\nmoe-exec --device=cuda, {r['layer']} at {r['tokens']} tokens: "
              f"relative difference to the CPU library {r['rel_error_vs_cpu']:.1e}.")
    if r["what"] == "memcheck":
        print(f"\ncompute-sanitizer memcheck ({r.get('layer', 'deepseek_v3')},"
              f" 1, 33 and 200 tokens): {'0 errors' if r['ok'] else 'ERRORS'}.")
    if r["what"] == "refused":
        print(f"\nrefused at compile time, {r['layer']}: {r['message']}")
