#!/usr/bin/env python3
"""arrows.py BUILD_DIR SOURCE_DIR -- the project's dependency arrows, from the built objects.

Two checks (docs/architecture.md, "Who calls whom"):
- no import circles: over every object file of the project's libraries, file A calls into
  file B when A's undefined symbols are defined in B (nm); the graph must have no cycle, so
  that each file can be read knowing only the files below it;
- module arrows: no file of exec/ (the executor) calls into sim/, export/, cli/, reports/ or validate/;
  no file of model/ or profiles/ calls into sim/, export/, exec/, cli/ or reports/; common/ calls
  into no other module; sim/ calls into neither export/, exec/ nor cli/; export/ (which reads
  plans) calls into none of sim/, exec/, cli/, reports/ or validate/.
Prints each violation and exits 1; 77 (skip) without nm or objects."""
import collections
import glob
import os
import re
import shutil
import subprocess
import sys

FORBIDDEN = [
    ("exec/", ("sim/", "export/", "cli/", "reports/", "validate/")),
    ("model/", ("sim/", "export/", "exec/", "cli/", "reports/")),
    ("profiles/", ("model/", "sim/", "export/", "exec/", "cli/", "reports/")),
    ("common/", ("model/", "profiles/", "sim/", "export/", "exec/", "cli/", "reports/", "kernels/")),
    ("sim/", ("export/", "exec/", "cli/")),
    ("export/", ("sim/", "exec/", "cli/", "reports/", "validate/")),
    ("kernels/", ("model/", "sim/", "export/", "exec/", "cli/", "reports/")),
]


def objects(build, src):
    """(object path, source path relative to src, variant) of every library object."""
    out = []
    pat = re.compile(re.escape(build) + r"/(.*?)CMakeFiles/([^/]+)\.dir/(.*)\.o$")
    for o in glob.glob(build + "/**/*.o", recursive=True):
        m = pat.match(o)
        if not m or m.group(2).startswith("test_") or "fuzz" in o:
            continue
        rel = os.path.normpath(os.path.join(m.group(1), m.group(3).replace("__/", "../")))
        if rel.startswith("tests/") or rel.startswith("gen/") or not os.path.exists(os.path.join(src, rel)):
            continue
        # the emulator builds the CUDA and exec sources again: a graph of its own
        variant = "emu" if "emu" in m.group(2) else "native"
        out.append((o, rel, variant))
    return out


def graph(objs):
    defs = collections.defaultdict(set)
    undef = collections.defaultdict(set)
    for o, rel, variant in objs:
        node = (rel, variant)
        text = subprocess.run(["nm", o], capture_output=True, text=True).stdout
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBR":
                defs[(parts[2], variant)].add(node)
            elif len(parts) == 2 and parts[0] == "U":
                undef[node].add(parts[1])
    edges = collections.defaultdict(set)
    for node, syms in undef.items():
        for s in syms:
            for d in defs.get((s, node[1]), ()):
                if d != node:
                    edges[node].add(d)
    return edges


def cycles(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not shutil.which("nm"):
        print("arrows: nm not found, skipping")
        return 77
    objs = objects(build, src)
    if not objs:
        print("arrows: no objects under", build)
        return 77
    edges = graph(objs)
    bad = 0
    for comp in cycles(edges):
        bad += 1
        print("FAILED: a circle of calls between", ", ".join(f"{r}" for r, _ in comp))
    for a, targets in sorted(edges.items()):
        for b in sorted(targets):
            for mod, banned in FORBIDDEN:
                if a[0].startswith(mod) and b[0].startswith(banned):
                    bad += 1
                    print(f"FAILED: {a[0]} calls into {b[0]} ({mod} must not depend on {b[0].split('/')[0]}/)")
    files = len({r for _, r, _ in objs})
    print(f"arrows: {files} files, {sum(len(t) for t in edges.values())} call arrows, "
          f"{bad} violation{'s' if bad != 1 else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
