"""Prints, for each token bucket of a layer's kernels (moe-compile
--emit=kernels on stdin), the kernels its plan launches per forward:
`bucket N: K launches (names)`."""
import re
import sys

text = sys.stdin.read()
start = text.find("moe.bucket_plans = [")
if start < 0:
    sys.exit("no moe.bucket_plans in the input")
for plan in text[start:].split("#moe.launch_plan<")[1:]:
    size = re.search(r"max_tokens = (\d+)", plan)
    if not size:
        continue
    plan = plan[: size.start()]
    kernels = re.findall(r"#moe.launch<kernel = @(\w+)", plan)
    print(f"bucket {size.group(1)}: {len(kernels)} launches ({' '.join(kernels)})")
