#!/usr/bin/env python3
"""report.html as a browser sees it: a validation of the tiny model writes a report, headless
Chromium loads it, and through the DOM every table must be a <table> with one row per row of
data parallax wrote (the layouts of validate --json, the quantities of compare --json under the
report's 1% rule, the plan's pipeline stages, the sizes of scaling.dat and scaling_sharded.dat), the scaling tables'
TFLOP/s per GPU must match their .dat files to three significant digits, every <img> must have
loaded (naturalWidth > 0), and in each chart's SVG every text (tic labels included) must lie
inside the image.

Usage: report_browser.py PARALLAX MAX_RANKS
Chromium is driven over --remote-debugging-pipe (the DevTools protocol, NUL-separated JSON on
file descriptors 3 and 4): Python's standard library only. PARALLAX_CHROMIUM names the browser;
else the first of chromium-headless-shell, chromium, chromium-browser, google-chrome on PATH.
Exit 0 pass, 1 fail, 77 skipped (no Chromium: scripts/install-deps.sh installs it)."""
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def fail(msg):
    print(f"FAILED: {msg}")
    sys.exit(1)


def find_browser():
    named = os.environ.get("PARALLAX_CHROMIUM")
    if named:
        path = shutil.which(named)
        if not path:
            fail(f"PARALLAX_CHROMIUM={named}: no such program")
        return path
    for b in BROWSERS:
        path = shutil.which(b)
        if path:
            return path
    print("SKIPPED: no Chromium on PATH (scripts/install-deps.sh installs chromium-headless-shell)")
    sys.exit(77)


class Browser:
    """One headless Chromium, spoken to over --remote-debugging-pipe."""

    def __init__(self, exe, tmp):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def fds():  # the protocol's fixed descriptors: 3 the browser reads, 4 it writes
            # moved above 10 first: a pipe end that already is 3 or 4 would be overwritten, or
            # kept close-on-exec by a dup2 onto itself
            hi_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            hi_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.log_path = os.path.join(tmp, "chromium.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--remote-debugging-pipe", "--window-size=1200,900",
             f"--user-data-dir={os.path.join(tmp, 'profile')}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            preexec_fn=fds, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read(self):
        while b"\0" not in self.buf:
            chunk = os.read(self.from_chrome, 65536)
            if not chunk:
                self.log.flush()
                fail("Chromium closed the DevTools pipe:\n" + open(self.log_path).read()[-3000:])
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            self.log.flush()
            fail(f"{method}: Chromium has exited:\n" + open(self.log_path).read()[-3000:])
        while True:
            m = self._read()
            if m.get("id") == self.next_id:
                if "error" in m:
                    fail(f"{method}: {m['error']}")
                return m["result"]
            self.events.append(m)

    def wait_event(self, method, session):
        while True:
            for i, m in enumerate(self.events):
                if m.get("method") == method and m.get("sessionId") == session:
                    del self.events[i]
                    return m
            self.events.append(self._read())

    def open(self, url):
        """A new page loaded with url (its load event fired: images included); its session."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=session)
        nav = self.call("Page.navigate", {"url": url}, session)
        if nav.get("errorText"):
            fail(f"{url}: {nav['errorText']}")
        self.wait_event("Page.loadEventFired", session)
        return session

    def evaluate(self, session, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True}, session)
        if "exceptionDetails" in r:
            fail(f"script failed: {r['exceptionDetails']}")
        return r["result"]["value"]

    def close(self):
        try:
            self.call("Browser.close")
        except SystemExit:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


PAGE_JS = r"""(() => {
  const out = {tables: [], images: [], stray: [], pre: document.querySelectorAll('pre').length};
  for (const t of document.querySelectorAll('table')) {
    let h = t.previousElementSibling;
    while (h && h.tagName !== 'H2') h = h.previousElementSibling;
    out.tables.push({heading: h ? h.textContent : '',
                     header: [...t.querySelectorAll('thead th')].map(e => e.textContent),
                     rows: [...t.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.textContent))});
  }
  for (const i of document.images)
    out.images.push({src: i.getAttribute('src'), complete: i.complete, w: i.naturalWidth, h: i.naturalHeight});
  // what a table or a fence looks like when it was not rendered as one
  for (const p of document.querySelectorAll('p'))
    if (/^\s*(\||```)/.test(p.textContent)) out.stray.push(p.textContent.slice(0, 80));
  return out;
})()"""

# every <text> of a gnuplot SVG in the image's own units (its viewBox), against the viewBox
SVG_JS = r"""(() => {
  const svg = document.documentElement, vb = svg.viewBox.baseVal, root = svg.getBoundingClientRect();
  const scale = root.width / vb.width, out = {width: vb.width, height: vb.height, texts: 0, outside: []};
  for (const t of document.querySelectorAll('text')) {
    if (!t.textContent.trim()) continue;
    const r = t.getBoundingClientRect();
    const box = [(r.left - root.left) / scale, (r.top - root.top) / scale,
                 (r.right - root.left) / scale, (r.bottom - root.top) / scale];
    out.texts++;
    if (box[0] < -0.5 || box[1] < -0.5 || box[2] > vb.width + 0.5 || box[3] > vb.height + 0.5)
      out.outside.push({text: t.textContent.trim(), box: box.map(x => Math.round(x))});
  }
  return out;
})()"""


def run(cmd, env, err_path):
    """cmd's standard output; its standard error kept in err_path, shown when it fails."""
    with open(err_path, "w") as err:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-2000:]}" + open(err_path).read()[-2000:])
    return r.stdout


def table(tables, heading):
    found = [t for t in tables if t["heading"] == heading]
    if len(found) != 1:
        fail(f"expected one table under '{heading}', found {len(found)} "
             f"(tables under: {[t['heading'] for t in tables]})")
    return found[0]


def expect_rows(name, t, want, why):
    got = len(t["rows"])
    if got != want:
        fail(f"{name} table: {got} rows in the DOM, {want} expected ({why})")
    print(f"  {name}: {got} rows ({why})")


def scaling_dat(path):
    """scaling.dat's blocks (strong TFLOP/s, weak TFLOP/s, ...): {gpus: value} each."""
    blocks, cur = [], None
    for line in open(path):
        line = line.strip()
        if line.startswith("#"):
            cur = {}
            blocks.append(cur)
        elif line and cur is not None:
            x, y = line.split()
            cur[int(float(x))] = float(y)
    return blocks


def main():
    if len(sys.argv) != 3:
        print("usage: report_browser.py PARALLAX MAX_RANKS", file=sys.stderr)
        sys.exit(2)
    px, max_ranks = sys.argv[1], sys.argv[2]
    exe = find_browser()
    signal.alarm(600)  # a browser that hangs fails the test instead of holding ctest
    tmp = tempfile.mkdtemp(prefix="px_report_browser_")
    try:
        check(px, max_ranks, exe, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check(px, max_ranks, exe, tmp):
    env = dict(os.environ, PARALLAX_UNCALIBRATED="1", PARALLAX_PROFILE_DIR=os.path.join(tmp, "none"))
    rdir = os.path.join(tmp, "v")
    out = run([px, "validate", "--model", "tiny", "--steps", "3", "--max-ranks", max_ranks,
               "--report", rdir, "--json"], env, os.path.join(tmp, "validate.err"))
    layouts = json.loads(out)["layouts"]
    # the layout the report details: the first timed one of the deepest pipeline
    pick, pick_pp = None, 0
    for l in layouts:
        pp = int(re.search(r"\bpp(\d+)\b", l["layout"]).group(1))
        if l["timing"] and (pick is None or pp > pick_pp):
            pick, pick_pp = l["index"], pp
    plan_path = os.path.join(rdir, f"plan-{pick:02d}.json")
    run_path = os.path.join(rdir, f"run-{pick:02d}.json")
    rows = json.loads(run([px, "compare", plan_path, run_path, "--json"], env,
                          os.path.join(tmp, "compare.err")))["rows"]
    step = rows[0]["predicted"] if rows else 0
    shown = [r for r in rows if not r["quantity"].startswith("op ") or
             r["predicted"] >= 0.01 * step or r["measured"] >= 0.01 * step]
    stages = len(json.load(open(plan_path))["prediction"]["memory"]["per_stage"])
    blocks = scaling_dat(os.path.join(rdir, "scaling.dat"))
    sizes = sorted(set(blocks[0]) | set(blocks[1]))
    sharded = scaling_dat(os.path.join(rdir, "scaling_sharded.dat"))
    sharded_sizes = sorted(set(sharded[0]) | set(sharded[1]))
    charts = re.findall(r"^!\[[^]]*\]\(([^)]+)\.png\)$", open(os.path.join(rdir, "report.md")).read(), re.M)

    b = Browser(exe, tmp)
    try:
        page = b.evaluate(b.open("file://" + os.path.join(rdir, "report.html")), PAGE_JS)
        print(f"report_browser: {exe}: {len(page['tables'])} tables, {len(page['images'])} images, "
              f"{page['pre']} code blocks")
        if page["stray"]:
            fail(f"Markdown left as paragraphs: {page['stray']}")
        t = table(page["tables"], "Validation: predicted against measured")
        expect_rows("validation", t, len(layouts), f"{len(layouts)} layouts in validate --json")
        got = [(r[0], r[2]) for r in t["rows"]]
        want = [(str(l["index"]), l["layout"]) for l in layouts]
        if got != want:
            fail(f"validation table's numbers and layouts {got} != validate --json's {want}")
        t = table(page["tables"], "Predicted against measured")
        expect_rows("predicted against measured", t, len(shown),
                    f"{len(shown)} of the {len(rows)} quantities of compare --json, "
                    f"{len(rows) - len(shown)} ops under 1% of the step left out")
        got = [r[0] for r in t["rows"]]
        if got != [r["quantity"] for r in shown]:
            fail(f"compare table's quantities {got} != compare --json's {[r['quantity'] for r in shown]}")
        t = table(page["tables"], "Memory per pipeline stage")
        expect_rows("memory", t, min(stages, 9), f"{stages} pipeline stages in plan-{pick:02d}.json")
        t = table(page["tables"], "Scaling")
        expect_rows("scaling", t, len(sizes), f"{len(sizes)} GPU counts in scaling.dat")
        for r in t["rows"]:
            for col, block in ((2, blocks[0]), (5, blocks[1])):
                want = block.get(int(r[0]))
                if want is None:
                    continue
                got = float(r[col])
                if abs(got - want) > 0.005 * abs(want):
                    fail(f"scaling table, {r[0]} GPUs: TFLOP/s per GPU {r[col]}, scaling.dat {want}")
        print(f"  scaling: TFLOP/s per GPU {[r[2] for r in t['rows']]} (strong) "
              f"{[r[5] for r in t['rows']]} (weak) agree with scaling.dat")
        t = table(page["tables"], "Sharded data parallelism against 3D")
        expect_rows("sharded", t, len(sharded_sizes), f"{len(sharded_sizes)} GPU counts in scaling_sharded.dat")
        for r in t["rows"]:
            for col, block in ((4, sharded[0]), (7, sharded[1])):
                want = block.get(int(r[0]))
                if want is None:
                    continue
                if abs(float(r[col]) - want) > 0.005 * abs(want):
                    fail(f"sharded table, {r[0]} GPUs: TFLOP/s per GPU {r[col]}, scaling_sharded.dat {want}")
        print(f"  sharded: TFLOP/s per GPU {[r[4] for r in t['rows']]} (ZeRO-3) "
              f"{[r[7] for r in t['rows']]} (3D) agree with scaling_sharded.dat")
        if len(page["tables"]) != 5:
            fail(f"{len(page['tables'])} tables in the page, 5 expected")
        if sorted(i["src"] for i in page["images"]) != sorted(c + ".svg" for c in charts):
            fail(f"images {[i['src'] for i in page['images']]} != the charts of report.md {charts}")
        for i in page["images"]:
            if not i["complete"] or i["w"] <= 0:
                fail(f"image {i['src']} did not load (naturalWidth {i['w']})")
            # an SVG without a size of its own is drawn at a browser's default, some 300x150
            if i["w"] < 480:
                fail(f"image {i['src']} is drawn {i['w']}x{i['h']}: the SVG lacks its width and height")
        print("  images: " + ", ".join(f"{i['src']} {i['w']}x{i['h']}" for i in page["images"]))
        for c in charts:
            s = b.evaluate(b.open("file://" + os.path.join(rdir, c + ".svg")), SVG_JS)
            if s["outside"]:
                fail(f"{c}.svg: text cut off at the edge of the {s['width']}x{s['height']} image: "
                     f"{s['outside']}")
            print(f"  {c}.svg: {s['texts']} texts, all inside {s['width']:.0f}x{s['height']:.0f}")
    finally:
        b.close()
    print("report_browser: passed")


if __name__ == "__main__":
    main()
