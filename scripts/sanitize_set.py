#!/usr/bin/env python3
"""sanitize_set.py -- which tests the sanitizer pass of scripts/test.sh can leave out.

  scripts/sanitize_set.py ASAN_LOG [--build DIR] [--jobs N] [--cheap S] [--only REGEX] [-o FILE]

Builds the project with gcov's counters (in DIR, default build-cov), runs every test that the
sanitizer pass would run, one at a time, each writing its counters under a folder of its own,
and reads from them the lines of parallax (every source outside tests/, bench/ and tools/) that
each test runs. Then it picks, greedily by new lines per second that the test took under the
sanitizers (ASAN_LOG: the output of that pass's ctest), a set of tests that runs every line the
whole suite runs, and drops from it any test the others make redundant. The tests outside that
set that took more than S seconds (default 5) under the sanitizers are added to FILE (default
tests/sanitize_repeat.txt; the tests it names already stay), which the build reads to give them the label `repeat`: the
sanitizer pass leaves them out, since every line they run runs there in another test. Prints
the figures: lines, tests and seconds, kept and left out.

With --only, the same over the tests whose names match REGEX (a family of layouts and the
tests added to it), the rest of FILE kept as it is: a test of the family is left out when the
family's kept tests run its lines, which is the whole suite's rule on fewer tests (it leaves
out no more than a run over all of them would)."""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_LABELS = "^(static|clients|slurm|browser|gpu|repeat)$"


def build(cov):
    # the tests as the sanitizer pass builds them: fewer rounds and no twins (PX_TEST_SANITIZED,
    # tests/test.h), so that a line counts as run only where the pass runs it
    flags = "-O1 -g --coverage -DPX_TEST_SANITIZED=1"
    subprocess.run(["cmake", "-S", SRC, "-B", cov, "-DCMAKE_BUILD_TYPE=Debug",
                    "-DCMAKE_C_FLAGS_DEBUG=" + flags, "-DCMAKE_CXX_FLAGS_DEBUG=" + flags,
                    "-DCMAKE_EXE_LINKER_FLAGS=--coverage"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", cov, "-j", str(os.cpu_count() or 2)], check=True,
                   stdout=subprocess.DEVNULL)


def test_names(cov):
    out = subprocess.run(["ctest", "-N", "-LE", SKIP_LABELS], cwd=cov, capture_output=True,
                         text=True, check=True).stdout
    return re.findall(r"Test +#\d+: (\S+)", out)


def run_one(cov, runs, name):
    """Runs one test with its counters under runs/name; True when it passed."""
    where = os.path.join(runs, name)
    subprocess.run(["rm", "-rf", where], check=True)
    os.makedirs(where)
    # each test runs its own single-rank references (tests/runs.h keeps them per build
    # otherwise, and the lines would count for whichever test ran first)
    env = dict(os.environ, GCOV_PREFIX=where, GCOV_PREFIX_STRIP="0", PX_TEST_NO_REF_CACHE="1")
    r = subprocess.run(["ctest", "-R", "^" + re.escape(name) + "$"], cwd=cov, env=env,
                       capture_output=True, text=True)
    return r.returncode == 0


def lines_of(runs, name):
    """The project's lines that one test ran: gcov over the counters it wrote."""
    root = os.path.join(runs, name)
    gcdas = glob.glob(root + "/**/*.gcda", recursive=True)
    for f in gcdas:
        notes, link = f[len(root):-5] + ".gcno", f[:-5] + ".gcno"
        if os.path.exists(notes) and not os.path.exists(link):
            os.symlink(notes, link)
    ran = set()
    dec = json.JSONDecoder()
    for i in range(0, len(gcdas), 40):
        text = subprocess.run(["gcov", "--json-format", "--stdout"] + gcdas[i:i + 40],
                              capture_output=True, text=True, cwd=root).stdout
        pos = 0
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                break
            doc, pos = dec.raw_decode(text, pos)
            for f in doc["files"]:
                rel = os.path.relpath(f["file"], SRC)
                if rel.startswith(("..", "tests/", "bench/", "tools/")):
                    continue
                ran.update(rel + ":" + str(l["line_number"]) for l in f["lines"] if l["count"] > 0)
    return ran


def seconds(log):
    took = {}
    with open(log) as f:
        for line in f:
            m = re.search(r"Test +#\d+: (\S+) .*?([\d.]+) sec", line)
            if m:
                took[m.group(1)] = float(m.group(2))
    return took


def cover(sets, took):
    """A set of tests that runs every line, cheap ones first, with no test the others make
    redundant."""
    every = set().union(*sets.values())
    kept, ran = [], set()
    while ran != every:
        best = max((t for t in sets if t not in kept),
                   key=lambda t: len(sets[t] - ran) / max(took.get(t, 1.0), 0.5))
        kept.append(best)
        ran |= sets[best]
    for t in sorted(kept, key=lambda t: -took.get(t, 1.0)):
        if sets[t] <= set().union(*(sets[o] for o in kept if o != t)):
            kept.remove(t)
    return every, kept


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("asan_log")
    ap.add_argument("--build", default=os.path.join(SRC, "build-cov"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cheap", type=float, default=5.0)
    ap.add_argument("--only", help="the tests to judge, a regular expression on their names")
    ap.add_argument("-o", "--output", default=os.path.join(SRC, "tests", "sanitize_repeat.txt"))
    a = ap.parse_args()
    # absolute: each test writes its counters under GCOV_PREFIX from its own working directory
    a.build = os.path.abspath(a.build)
    took = seconds(a.asan_log)
    build(a.build)
    names = test_names(a.build)
    if a.only:
        names = [n for n in names if re.search(a.only, n)]
        if not names:
            sys.exit(f"sanitize_set: no test the pass runs matches {a.only!r}")
    # the tests already out stay out (the pass runs no test labelled repeat, so they are not
    # among names): what they run, the tests that covered it when they left still run
    kept_before = []
    if os.path.exists(a.output):
        kept_before = [l.strip() for l in open(a.output)
                       if l.strip() and not l.startswith("#") and l.strip() not in names]
    runs = os.path.join(a.build, "runs")
    print(f"running {len(names)} tests one at a time, {a.jobs} at once", file=sys.stderr)
    with ThreadPoolExecutor(a.jobs) as pool:
        passed = list(pool.map(lambda n: run_one(a.build, runs, n), names))
    failed = [n for n, ok in zip(names, passed) if not ok]
    if failed:
        sys.exit("sanitize_set: these tests failed, fix them first: " + " ".join(failed))
    sets = {n: lines_of(runs, n) for n in names}
    if not any(sets.values()):
        sys.exit("sanitize_set: the tests wrote no coverage counters under " + runs +
                 ": is the build in " + a.build + " one with --coverage?")
    every, kept = cover(sets, took)
    left = sorted(n for n in names if n not in kept and took.get(n, 0.0) > a.cheap)
    judged = left
    left = sorted(set(left) | set(kept_before))
    with open(a.output, "w") as f:
        f.write("# Tests the sanitizer pass leaves out (label repeat): every line of parallax they run\n"
                "# runs there in another test, and each took over %g s under the sanitizers.\n"
                "# Written by scripts/sanitize_set.py (docs/testing.md); one name per line.\n" % a.cheap)
        f.writelines(n + "\n" for n in left)
    total = sum(took.get(n, 0.0) for n in names)
    out = sum(took.get(n, 0.0) for n in judged)
    print(f"{len(every)} lines of parallax run by {len(names)} tests; {len(kept)} tests run them all")
    print(f"left out of the sanitizer pass: {len(judged)} of these tests, {out:.0f} of {total:.0f} s"
          f", with the {len(kept_before)} already out; written to {a.output}")


if __name__ == "__main__":
    main()
