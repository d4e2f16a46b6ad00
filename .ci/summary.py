#!/usr/bin/env python3
"""Prints 'N passed, N failed' over meson test logs: cmocka test cases (TAP 'ok'/'not ok'
lines) of every test binary, plus non-TAP tests (tool smoke tests) counted by their result."""
import json
import re
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            t = json.loads(line)
            out = t.get("stdout") or ""
            oks = len(re.findall(r"^ok \d+", out, re.M))
            noks = len(re.findall(r"^not ok \d+", out, re.M))
            skips = len(re.findall(r"^ok \d+.*# SKIP", out, re.M))
            # cmocka prints a skip() as "not ok N # SKIP name": a skip, not a failure
            nok_skips = len(re.findall(r"^not ok \d+.*# SKIP", out, re.M))
            if oks + noks:  # a cmocka binary speaking TAP
                passed += oks - skips
                skipped += skips + nok_skips
                failed += noks - nok_skips
                if t["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and noks == nok_skips:
                    failed += 1  # crashed outside a test case
            elif t["result"] in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif t["result"] == "SKIP":
                skipped += 1
            else:
                failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
