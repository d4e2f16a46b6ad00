#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Rewrites a CUDA source for the CPU kernel emulator (tests/kernel_emu): every launch
`kernel<<<grid, block, shmem, stream>>>(args)` becomes `kemu::launch(grid, block, shmem,
stream).run(kernel, args)`; nothing else changes. Newlines inside a launch are kept, so line
numbers in diagnostics still match the .cu file. Usage: cu2cc.py IN.cu OUT.cc"""
import re
import sys

# The kernel: a name with optional template arguments (no nested <>), then <<<config>>>(.
LAUNCH = re.compile(r"([A-Za-z_]\w*(?:\s*<[^<>;()]*>)?)(\s*)<<<(.*?)>>>(\s*)\(", re.S)


def rewrite(m):
    kernel, gap1, config, gap2 = m.groups()
    nl = (gap1 + gap2).count("\n")
    return "kemu::launch(%s).run(%s,%s" % (config, kernel, "\n" * nl)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cu2cc.py IN.cu OUT.cc")
    src = open(sys.argv[1], encoding="utf-8").read()
    out = LAUNCH.sub(rewrite, src)
    if "<<<" in out or ">>>" in out:
        sys.exit("%s: a kernel launch the rewrite did not recognise" % sys.argv[1])
    if re.search(r"\.run\([^,()]*,\s*\)", out):
        sys.exit("%s: a launch without arguments" % sys.argv[1])
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write('#line 1 "%s"\n' % sys.argv[1])
        f.write(out)


if __name__ == "__main__":
    main()
