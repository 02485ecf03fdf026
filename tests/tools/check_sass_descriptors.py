#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails if a kernel's asynchronous copies (LDGSTS) read a memory descriptor
register that nothing in the kernel writes.

    check_sass_descriptors.py LIBRARY [--cuobjdump PATH]

The K/V copies of the tensor-core kernel carry an L2 evict-first policy when
FD_KV_EVICT_FIRST is on (src/backend/cuda/load.cuh). ptxas before 13.4.59
can drop the createpolicy that produces the policy and keep the copies that
use it: their descriptor register (desc[URn] in the SASS) is then never
written and the kernel stops on an illegal instruction. On flashdecode's
kernels, ptxas 13.0 and 13.3.73 built 4 such kernels (the head_dim-64
bucket), 13.4.59 and 13.5.37 none; since the cluster-merge instances, 13.0
builds 8 of 36 (the head_dim-64 ones of both merges) and 13.4.59 none. The check reads the SASS (cuobjdump -sass, which needs nvdisasm
on PATH), so it needs no GPU.

A register counts as written when an instruction names it as its destination
(a uniform instruction's first operand, or R2UR's); a 64-bit form (.64)
writes the pair.

Passing is necessary, not sufficient: ptxas 13.0 also points the copies of
the other 20 kernels at registers that unrelated code writes (in the
head_dim-128 kernels, a division's result), which this check cannot tell
from a policy. A correct build (13.4.59, 13.5.37) materialises the policy
in the descriptor register (a UMOV of 0x120, shifted) before the copies.
So builds with an older ptxas keep the hint off whatever this check says.
"""
import argparse
import re
import subprocess
import sys

WRITE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?((?:U\w+|R2UR)(?:\.[\w:]+)*)\s+UR(\d+)\b")
DESCRIPTOR_USE = re.compile(r"LDGSTS[^;]*desc\[UR(\d+)\]")


def unwritten_descriptors(sass):
    """(function name, sorted unwritten registers) for each offending function."""
    bad = []
    functions = re.split(r"\n\s*Function : ", sass)[1:]
    for body in functions:
        name = body.split("\n", 1)[0].strip()
        written = set()
        for match in WRITE.finditer(body):
            register = int(match.group(2))
            written.add(register)
            if ".64" in match.group(1):
                written.add(register + 1)
        used = {int(r) for r in DESCRIPTOR_USE.findall(body)}
        if used - written:
            bad.append((name, sorted(used - written)))
    return len(functions), bad


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("library")
    parser.add_argument("--cuobjdump", default="cuobjdump")
    args = parser.parse_args()
    result = subprocess.run([args.cuobjdump, "-sass", args.library], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"check_sass_descriptors: {args.cuobjdump} -sass {args.library} failed:\n{result.stderr}")
    count, bad = unwritten_descriptors(result.stdout)
    if count == 0:
        sys.exit(f"check_sass_descriptors: no kernels in the SASS of {args.library}")
    for name, registers in bad:
        print(f"{name}: LDGSTS descriptor {', '.join(f'UR{r}' for r in registers)} never written")
    if bad:
        sys.exit(f"check_sass_descriptors: {len(bad)} of {count} kernels would stop on an illegal instruction "
                 "(a ptxas before 13.4.59 with FD_KV_EVICT_FIRST on?)")
    print(f"ok: {count} kernels, every LDGSTS descriptor written")


if __name__ == "__main__":
    main()
