#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Unit test of check_sass_descriptors.py on SASS excerpts: the defect it
looks for (seen with ptxas 13.0 and 13.3.73) and the forms that are fine."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_sass_descriptors import unwritten_descriptors  # noqa: E402


def function(name, *instructions):
    lines = [f"\t\tFunction : {name}"]
    for i, text in enumerate(instructions):
        lines.append(f"        /*{i * 16:04x}*/                   {text} ;        /* 0x0000000000000000 */")
    return "\n".join(lines) + "\n"


HEADER = "\nFatbin elf code:\n================\narch = sm_90a\n\n\tcode for sm_90a\n"


class UnwrittenDescriptors(unittest.TestCase):
    def test_default_descriptor_pair_is_written(self):
        sass = HEADER + function("ok", "ULDC.64 UR12, c[0x0][0x208]",
                                 "LDGSTS.E.BYPASS.128 [R6], desc[UR12][R8.64], P4",
                                 "LDGSTS.E.BYPASS.128 [R6+0x4000], desc[UR13][R8.64], P4")
        self.assertEqual(unwritten_descriptors(sass), (1, []))

    def test_predicated_and_r2ur_writes_count(self):
        sass = HEADER + function("ok", "@P0 UMOV UR4, 0x1", "R2UR UR5, R2",
                                 "LDGSTS.E.BYPASS.128 [R6], desc[UR4][R8.64], P4",
                                 "LDGSTS.E.BYPASS.128 [R6], desc[UR5][R8.64], P4")
        self.assertEqual(unwritten_descriptors(sass), (1, []))

    def test_dropped_policy_is_reported(self):
        # ptxas 13.0, FD_KV_EVICT_FIRST on: the policy's register is read, never set.
        sass = HEADER + function("fine", "ULDC.64 UR12, c[0x0][0x208]",
                                 "LDGSTS.E.BYPASS.128 [R6], desc[UR12][R8.64], P4") + function(
            "broken", "ULDC.64 UR18, c[0x0][0x2c0]", "S2UR UR14, SR_CTAID.Y",
            "LDGSTS.E.BYPASS.128 [R90+UR0], desc[UR1][R18.64], P1")
        self.assertEqual(unwritten_descriptors(sass), (2, [("broken", [1])]))

    def test_a_read_is_not_a_write(self):
        sass = HEADER + function("broken", "IADD3 R37, P3, R28, UR26, RZ", "UIMAD UR12, UR26, UR13, URZ",
                                 "LDGSTS.E.BYPASS.128 [R6], desc[UR26][R8.64], P4")
        self.assertEqual(unwritten_descriptors(sass), (1, [("broken", [26])]))


if __name__ == "__main__":
    unittest.main()
