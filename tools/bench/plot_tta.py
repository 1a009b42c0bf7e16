#!/usr/bin/env python3
"""Plots netem_tta.sh's runs: rank 0's test accuracy against wall time, one
line per method, one PNG per link rate (<out>/tta_<rate>.png), the target as
a dashed line.

  plot_tta.py OUT_DIR TARGET

Needs Debian's python3-matplotlib; without it, says so and plots nothing.
"""

import csv
import os
import sys


def main():
    out, target = sys.argv[1], float(sys.argv[2])
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_tta.py: no plot: python3-matplotlib is not installed "
              "(apt-get install python3-matplotlib)")
        return 0
    for rate in sorted(os.listdir(out)):
        rate_dir = os.path.join(out, rate)
        if not os.path.isdir(rate_dir):
            continue
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for method in sorted(os.listdir(rate_dir)):
            path = os.path.join(rate_dir, method, "worker_0.csv")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                rows = list(csv.DictReader(f))
            axes.plot([float(r["wall_seconds"]) for r in rows],
                      [100 * float(r["test_accuracy"]) for r in rows], marker=".", label=method)
        axes.axhline(100 * target, color="grey", linestyle="--", linewidth=1)
        axes.set_xscale("log")
        axes.set_xlabel("wall time (s, log scale)")
        axes.set_ylabel("test accuracy of rank 0 (%)")
        axes.set_title(f"time to accuracy, {rate} per worker link")
        axes.set_ylim(max(0, 100 * target - 25), 100)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        png = os.path.join(out, f"tta_{rate}.png")
        figure.savefig(png, dpi=110)
        plt.close(figure)
        print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
