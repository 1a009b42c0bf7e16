#!/usr/bin/env python3
"""Checks that no #include runs up a layer (README.md, "Source layout").

Each folder of the tree has a layer; a source file may include files of its
own folder and of folders of lower layers only. Two folders of one layer
(server/ and worker/data/, say) may not include each other. Prints every
include that breaks the rule and exits 1 when there is one.
  tools/check_layers.py [ROOT]
"""
import os
import re
import sys

# Folder (longest prefix wins) -> layer. A file in no folder listed here is
# not checked.
LAYERS = {
    "common": 1,
    "server": 2,
    "worker/data": 2,
    "worker/optim": 2,
    "worker/group": 2,
    "worker/model": 3,
    "worker/ps": 3,
    "worker/device": 4,
    "worker/cuda/kernels": 4,
    "worker/algorithms": 5,
    "worker/trainer": 6,
    "worker/cuda": 7,
    "worker/worker_main.cc": 8,
    "tools/cluster": 8,
    "tools/bench": 9,
    "tools/launch": 9,
    "python/native": 9,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = (".h", ".cc", ".cu")


def folder_of(path):
    best = None
    for folder in LAYERS:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = []
    checked = 0
    for top in ("common", "server", "worker", "tools", "python"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                mine = folder_of(path)
                if mine is None:
                    continue
                checked += 1
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        theirs = folder_of(m.group(1))
                        if theirs is None or theirs == mine:
                            continue
                        if LAYERS[theirs] >= LAYERS[mine]:
                            bad.append(f"{path}:{number}: includes {m.group(1)} "
                                       f"({theirs}, layer {LAYERS[theirs]}) from "
                                       f"{mine}, layer {LAYERS[mine]}")
    for line in bad:
        print(line)
    print(f"check_layers: {checked} files, {len(bad)} includes running up a layer")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
