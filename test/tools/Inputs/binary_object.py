"""Prints the object (PTX) of the one gpu.binary in an MLIR file, with
MLIR's string escapes undone, as moe-compile --emit=ptx writes it."""
import re
import sys

text = open(sys.argv[1]).read()
match = re.search(r'#gpu\.object<.*?(?:assembly|bin) = "((?:[^"\\]|\\.)*)"', text)
if not match:
    sys.exit("no gpu.object in " + sys.argv[1])
escaped = match.group(1)
out = re.sub(r'\\([0-9A-Fa-f]{2}|\\|")',
             lambda m: m.group(1) if m.group(1) in ('\\', '"')
             else chr(int(m.group(1), 16)), escaped)
sys.stdout.write(out)
