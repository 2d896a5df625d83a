#!/usr/bin/env python3
"""tools/ncu_kernel_times.py on a CSV in the shape Nsight Compute writes (--csv --metrics
gpu__time_duration.sum, ==PROF== lines around it): sums by kernel across units, ranks, folds the rest,
and fails with a message on input it cannot read."""
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "ncu_kernel_times.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def row(i, kernel, unit, value, metric="gpu__time_duration.sum"):
    return (f'"{i}","7","model_bench","127.0.0.1","{kernel}","1","13","(128, 1, 1)","(64, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"\n')


def run(text, *args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "p.csv")
        with open(path, "w") as f:
            f.write(text)
        return subprocess.run([sys.executable, TOOL, path, *args], capture_output=True, text=True)


class NcuKernelTimes(unittest.TestCase):
    def test_sums_ranks_and_folds(self):
        text = ("==PROF== Connected to process 7\n" + HEADER + row(0, "moe_kernel", "msecond", "1.5") +
                row(1, "kda_kernel", "usecond", "250") + row(2, "moe_kernel", "nsecond", "1,000,000") +
                row(3, "norm_kernel", "usecond", "100") + row(4, "norm_kernel", "usecond", "50") +
                "==PROF== Disconnected from process 7\n")
        r = run(text, "--top", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "5 kernels, 2.900 ms of kernel time")
        self.assertEqual(lines[3], "| moe_kernel | 2 | 2.500 | 86.2% |")
        self.assertEqual(lines[4], "| kda_kernel | 1 | 0.250 | 8.6% |")
        self.assertEqual(lines[5], "| (1 others) | 2 | 0.150 | 5.2% |")
        self.assertEqual(len(lines), 6)

    def test_other_metrics_are_ignored(self):
        r = run(HEADER + row(0, "a_kernel", "usecond", "10") + row(1, "a_kernel", "byte", "99", metric="dram__bytes.sum"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| a_kernel | 1 | 0.010 | 100.0% |", r.stdout)

    def test_unreadable_input_fails_with_a_message(self):
        for text, message in [("==PROF== no kernels were profiled\n", "no CSV rows"),
                              (HEADER + row(0, "a", "usecond", "1", metric="dram__bytes.sum"), "no gpu__time_duration.sum rows"),
                              (HEADER + row(0, "a", "cycle", "5"), "unknown time unit 'cycle'")]:
            r = run(text)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(message, r.stderr)


if __name__ == "__main__":
    unittest.main()
