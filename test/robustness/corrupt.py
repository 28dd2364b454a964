#!/usr/bin/env python3
"""Feeds randomly corrupted copies of the example layers to moe-opt.

Every copy must end with exit code 0 (still valid) or 1 with an "error:"
diagnostic: never a crash, an assertion, another exit code or a hang. A failing
copy is written next to the test output so it can be replayed by hand.
"""
import argparse
import os
import random
import re
import subprocess
import sys

TYPES = ["bf16", "f32", "f16", "i32", "i1", "f8E4M3FN", "f8E8M0FNU", "index",
         "tensor<?xbf16>", "tensor<*xbf16>", "memref<4xf32>", "none"]
NUMBERS = ["0", "-1", "1", "2", "3", "7", "-8", "256", "65536", "2147483648",
           "9223372036854775807", "99999999999999999999999", "1.5", "-0.0",
           "0x7FC00000", "1e400", "?"]
WORDS = ["softmax_topk", "topk_softmax", "sigmoid_grouped_topk",
         "sigmoid_scale_input", "swiglu", "clamped_swiglu", "mxfp8",
         "fp8_block128", "true", "false", "moe.layer", "moe.route",
         "moe.combine", "router", "experts", "shared", "scales", "biases",
         "config", "func.func", "return", "{", "}", "(", ")", "<", ">", ",",
         "=", ":", "->", "%hidden_states", "#moe.config<>", "#moe.router<kind = swiglu>",
         "\"", "//", "^bb0:"]


def mutate(text, rng):
    kind = rng.choice(["truncate", "drop", "number", "type", "word", "dims",
                       "bytes", "duplicate"])
    lines = text.splitlines(keepends=True)
    if kind == "truncate":
        return kind, text[:rng.randrange(len(text))]
    if kind == "drop":
        for _ in range(rng.randint(1, 3)):
            if lines:
                del lines[rng.randrange(len(lines))]
        return kind, "".join(lines)
    if kind == "duplicate":
        i = rng.randrange(len(lines))
        lines.insert(i, lines[rng.randrange(len(lines))])
        return kind, "".join(lines)
    if kind == "bytes":
        pos = rng.randrange(len(text))
        junk = "".join(chr(rng.randrange(1, 256)) for _ in range(rng.randint(1, 4)))
        return kind, text[:pos] + junk + text[pos + rng.randint(0, 3):]
    pattern = {
        "number": r"-?\d+(\.\d+)?",
        "type": r"\b(bf16|f32|f8E4M3FN|f8E8M0FNU|i32)\b",
        "word": r"[A-Za-z_][A-Za-z_0-9.]*",
        "dims": r"tensor<[^>]*>",
    }[kind]
    matches = list(re.finditer(pattern, text))
    if not matches:
        return kind, text
    m = rng.choice(matches)
    if kind == "number":
        new = rng.choice(NUMBERS)
    elif kind == "type":
        new = rng.choice(TYPES)
    elif kind == "word":
        new = rng.choice(WORDS)
    else:
        dims = m.group(0)[len("tensor<"):-1].split("x")
        op = rng.choice(["drop", "swap", "add"])
        if op == "drop" and len(dims) > 1:
            del dims[rng.randrange(len(dims) - 1)]
        elif op == "swap" and len(dims) > 2:
            i = rng.randrange(len(dims) - 2)
            dims[i], dims[i + 1] = dims[i + 1], dims[i]
        else:
            dims.insert(rng.randrange(len(dims)), rng.choice(["1", "?", "0", "3"]))
        new = "tensor<" + "x".join(dims) + ">"
    return kind, text[:m.start()] + new + text[m.end():]


def run(tool, args, text, timeout):
    return subprocess.run([tool] + args, input=text.encode("utf-8", "replace"),
                          capture_output=True, timeout=timeout)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100, help="copies per example")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--out", default=".", help="where failing copies go")
    ap.add_argument("examples", nargs="+")
    opts = ap.parse_args()

    rng = random.Random(opts.seed)
    failures, valid, rejected = 0, 0, 0
    for path in opts.examples:
        original = open(path).read()
        for i in range(opts.count):
            kind, text = mutate(original, rng)
            if rng.random() < 0.3:  # Some copies get two corruptions.
                kind2, text = mutate(text, rng)
                kind += "+" + kind2
            problem = None
            try:
                proc = run(opts.tool, ["--moe-decompose", "-"], text, opts.timeout)
                stderr = proc.stderr.decode("utf-8", "replace")
                if proc.returncode == 0:
                    valid += 1
                    # What was accepted must print something that reads back.
                    again = run(opts.tool, ["-"], proc.stdout.decode(), opts.timeout)
                    if again.returncode != 0:
                        problem = "decomposed output does not parse:\n" + again.stderr.decode()
                elif proc.returncode == 1 and "error:" in stderr:
                    rejected += 1
                else:
                    problem = f"exit code {proc.returncode}:\n{stderr[-2000:]}"
            except subprocess.TimeoutExpired:
                problem = f"no answer within {opts.timeout} s"
            if problem:
                failures += 1
                name = os.path.join(opts.out, f"corrupt-{os.path.basename(path)}-{i}.mlir")
                with open(name, "w") as f:
                    f.write(text)
                print(f"FAIL {path} copy {i} ({kind}): {problem}\n  replay: {opts.tool} --moe-decompose {name}")
    print(f"{valid} copies still valid, {rejected} rejected with a diagnostic, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
