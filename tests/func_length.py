#!/usr/bin/env python3
"""func_length.py SOURCE_DIR [LIMIT] -- no function of the project longer than LIMIT lines (150).

A function is counted from the first line of its signature (the line at column 0 above its
opening brace) to its closing brace at column 0, both included, which is how the project lays
functions out (docs/testing.md). tests/ is left out: a test's main may read as one long list
of checks. Prints every function over the limit with its file and line, and exits 1 when there
is one; prints the five longest otherwise."""
import os
import re
import sys

SKIP_DIRS = {".git", "tests", "shared"}
NAME = re.compile(r"([A-Za-z_]\w*)\s*\(")


def functions(path):
    """(lines, name, line) of every function in path."""
    with open(path, errors="replace") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("{") and i > 0:
            start = i - 1
            # a signature's continuation lines are indented; its first line is not
            while start > 0 and lines[start].startswith((" ", "\t")):
                start -= 1
            end = i + 1
            while end < len(lines) and not lines[end].startswith("}"):
                end += 1
            m = NAME.search(lines[start])
            if m and not lines[start].rstrip().endswith(("=", ";")):
                out.append((end - start + 1, m.group(1), start + 1))
            i = end
        i += 1
    return out


def main():
    src = sys.argv[1]
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 150
    found = []
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        if rel.split(os.sep)[0] in SKIP_DIRS:
            continue
        for name in files:
            if name.endswith((".c", ".h", ".cu", ".cuh", ".cpp")):
                path = os.path.join(root, name)
                for n, fn, line in functions(path):
                    found.append((n, fn, os.path.relpath(path, src), line))
    found.sort(reverse=True)
    over = [f for f in found if f[0] > limit]
    for n, fn, path, line in over:
        print(f"{path}:{line}: {fn} is {n} lines (at most {limit})")
    if over:
        return 1
    for n, fn, path, line in found[:5]:
        print(f"{n:5d}  {fn}  {path}:{line}")
    print(f"ok: {len(found)} functions, none over {limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
