#!/usr/bin/env python3
"""Counts the walk of one training step through the source files, from a trace that
bench/step_walk_trace.c recorded (one line an event: "E <function> <call site>" a call,
"X <function>" its return; offsets into the program). Each function is mapped to the file that
defines it (addr2line on the program's debug information); the calls are followed as a stack.

Two views of the same step:
  the walk     each call written in the code (a call site and the function it reaches) counted
               once, as a reader who follows every call of the step once meets it; the same on
               every run of the same code and plan
  every call   every call the step made (loops over layers and micro-batches included), but a
               run of calls back to back from one call site counts once with what they call (a
               poll's spins, which vary from run to run, and a kernel's inner loops)

Counted in each:
  files entered          distinct files whose functions ran during the step
  cross-file calls       calls from a function of one file into a function of another
  entries per file       those calls, by the file called
  arrivals per file      the reader's arrivals in a file from another: the calls into it and
                         the returns into it
  climbs back            cross-file calls into a file already on the call stack below the caller
                         (a call back up: the callee's file is an ancestor)
  returns to files left  returns that land in another file than the one returning

Usage: step_walk.py PROGRAM TRACE SRC_ROOT [--top N]
"""
import collections
import os
import subprocess
import sys


def file_of_offsets(program, offsets, root):
    """The defining file of each function offset, relative to root where it lies inside."""
    order = sorted(offsets)
    out = subprocess.run(["addr2line", "-f", "-e", program] + ["%x" % o for o in order],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    files = {}
    for i, off in enumerate(order):
        where = out[2 * i + 1].split(":")[0]
        if where.startswith(root + os.sep):
            where = os.path.relpath(where, root)
        files[off] = where if where != "??" else "?? (%s)" % out[2 * i]
    return files


def walk(events, files, once):
    """The counts of the docstring over the trace's events; once: each (call site, function)
    counted at its first call only (a climb when any of its calls climbs); else every call but
    the repeats of the call just before it from the same site, and what they call."""
    stack = []  # [file, counted, edge, the edge of its last child]
    entered = set()
    seen = {}  # (site, function) -> a climb was counted for it (the walk)
    entries = collections.Counter()
    arrivals = collections.Counter()
    climbs = collections.Counter()
    calls = cross = returns_left = 0
    skip = 0  # within a repeat: its depth
    for ev in events:
        f = files[ev[1]]
        if ev[0] == "X":
            leaving = stack.pop()
            if stack:
                stack[-1][3] = leaving[2]
                if stack[-1][0] != leaving[0] and leaving[1]:
                    returns_left += 1
                    arrivals[stack[-1][0]] += 1
            if skip > len(stack):
                skip = 0
            continue
        entered.add(f)
        edge = (ev[2], ev[1])
        count = stack != [] and skip == 0
        if count and not once and stack[-1][3] == edge:
            skip = len(stack) + 1
            count = False
        if count:
            caller = stack[-1][0]
            climb = f != caller and any(s[0] == f for s in stack)
            if once and edge in seen:
                count = False
                if climb and not seen[edge]:
                    seen[edge] = True
                    climbs[(caller, f)] += 1
            else:
                seen[edge] = climb
                calls += 1
                if f != caller:
                    cross += 1
                    entries[f] += 1
                    arrivals[f] += 1
                    if climb:
                        climbs[(caller, f)] += 1
        stack.append([f, count, edge, None])
    return {
        "calls": calls,
        "files": entered,
        "cross": cross,
        "entries": entries,
        "arrivals": arrivals,
        "climbs": climbs,
        "returns_left": returns_left,
    }


def report(title, w, top, list_files):
    print("  %s" % title)
    print("    calls                  %7d" % w["calls"])
    print("    files entered          %7d" % len(w["files"]))
    print("    cross-file calls       %7d" % w["cross"])
    print("    climbs back            %7d" % sum(w["climbs"].values()))
    print("    returns to files left  %7d" % w["returns_left"])
    print("    entries per file (the %d most):" % top)
    for f, n in w["entries"].most_common(top):
        print("      %7d  %s" % (n, f))
    print("    arrivals per file (the %d most):" % top)
    for f, n in w["arrivals"].most_common(top):
        print("      %7d  %s" % (n, f))
    if list_files:
        print("    files: %s" % " ".join(sorted(w["files"])))
    if w["climbs"]:
        print("    climbs back (caller's file -> the ancestor's):")
        for (caller, f), n in w["climbs"].most_common(top):
            print("      %7d  %s -> %s" % (n, caller, f))


def main(argv):
    if len(argv) < 4:
        sys.stderr.write(__doc__)
        return 2
    program, trace, root = argv[1], argv[2], os.path.abspath(argv[3])
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 10
    events = []
    with open(trace) as t:
        for line in t:
            p = line.split()
            events.append((p[0], int(p[1], 16), int(p[2], 16) if len(p) > 2 else 0))
    if not events:
        sys.stderr.write("step_walk: %s holds no events (was the step reached?)\n" % trace)
        return 1
    files = file_of_offsets(program, {e[1] for e in events}, root)
    report("the walk (each call site once)", walk(events, files, True), top, True)
    report("every call", walk(events, files, False), top, False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
