#!/usr/bin/env python3
"""Checks the layering docs/ARCHITECTURE.md draws: every #include of a Baton
header reaches the including folder's own layer or one below it, except the
arrows the map names as running back up. Fails naming each file and include
that breaks it, so the map and the code cannot drift apart unnoticed.

  python3 tests/tools/layering_test.py [--root DIR]
"""
import argparse
import pathlib
import re
import sys

# Bottom to top, as the module map lists them; folders on one line share a
# layer and may include each other.
LAYERS = [
    {"common"},
    {"kernels"},
    {"kv_transfer"},
    {"engine"},
    {"cluster"},
    {"router"},
    {"node"},
    {"prefill_node", "decode_node"},
    {"tools"},
]
# The arrows docs/ARCHITECTURE.md ("Dependencies") names as running back up:
# (file prefix, included folder).
NAMED_EXCEPTIONS = []
SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/', re.MULTILINE)


def layer_of(folder):
    for index, layer in enumerate(LAYERS):
        if folder in layer:
            return index
    return None


def violations(root):
    found = []
    checked = 0
    for layer in LAYERS:
        for folder in sorted(layer):
            for path in sorted((root / folder).rglob("*")):
                if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                    continue
                checked += 1
                relative = path.relative_to(root).as_posix()
                for included in INCLUDE.findall(path.read_text(errors="replace")):
                    target = layer_of(included)
                    if target is None or target <= layer_of(folder):
                        continue
                    if any(relative.startswith(prefix) and included == folder_up
                           for prefix, folder_up in NAMED_EXCEPTIONS):
                        continue
                    found.append(f"{relative} includes {included}/, a layer above {folder}/")
    return found, checked


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parents[2])
    root = pathlib.Path(parser.parse_args().root)
    found, checked = violations(root)
    if checked < 100:
        print(f"layering: only {checked} source files under {root}: wrong root?")
        return 1
    for line in found:
        print("layering:", line)
    if found:
        print("layering: docs/ARCHITECTURE.md's map says otherwise; fix the include or the map")
        return 1
    print(f"layering: {checked} files, every include within the map")
    return 0


if __name__ == "__main__":
    sys.exit(main())
