"""Do two source trees compile every recorded kernel variant to the same PTX? A refactor of the
Triton kernels (a helper function folded out of several kernels, names changed) that leaves every
variant's instructions as they were changes neither the results nor the speed on the GPU; this
says so on a machine without one (Triton compiles for sm_90 on the CPU).

    # 1. record the variants the compile test launches (the interpreter; a few tens of seconds)
    TSM_KEEP_LAUNCHES=/tmp/launches.json TRITON_INTERPRET=1 python -m pytest -m integration \\
        tests/engines/triton/test_kernels_compile.py
    # 2. compile them with each tree (~3 minutes each), keeping each variant's PTX
    for t in before after; do mkdir -p /tmp/ptx_$t; PYTHONPATH=<tree>/src TSM_COMPILE_REPORT=1 \\
        TSM_COMPILE_PTX=/tmp/ptx_$t TRITON_CACHE_DIR=/tmp/tc_$t \\
        python tests/engines/triton/compile_kernels.py /tmp/launches.json; done
    # 3. compare
    python scripts/ptx_compare.py /tmp/ptx_before /tmp/ptx_after

Debug information is left out (``.loc`` / ``.file`` lines, the debug sections, the ``$L__tmpN``
labels that mark inlined functions' ranges); everything else must match line for line. Exits 1
if any variant differs, and prints the first differing lines of each.
"""

import difflib
import os
import re
import sys


def instructions(ptx: str) -> list:
    """The PTX's lines without debug information or blank lines, stripped."""
    out, in_debug = [], False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and "debug" in s:
            in_debug = True
        if in_debug:
            in_debug = s != "}"
            continue
        if not s or s.startswith((".loc", ".file", "//")) or re.fullmatch(r"\$L__tmp\d+:", s):
            continue
        out.append(s)
    return out


def main(before: str, after: str) -> int:
    names = sorted(os.listdir(before))
    if names != sorted(os.listdir(after)):
        print("the two folders hold different variants:", sorted(set(names) ^ set(os.listdir(after))))
        return 1
    differ = 0
    for name in names:
        a = instructions(open(os.path.join(before, name)).read())
        b = instructions(open(os.path.join(after, name)).read())
        if a != b:
            differ += 1
            print(f"DIFFERS {name}")
            for line in list(difflib.unified_diff(a, b, lineterm="", n=1))[2:12]:
                print("   ", line)
    print(f"{len(names) - differ} of {len(names)} variants compile to the same instructions")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
