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
import base64
import collections
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
        self.call("Network.enable", session=session)
        nav = self.call("Page.navigate", {"url": url}, session)
        if nav.get("errorText"):
            fail(f"{url}: {nav['errorText']}")
        self.wait_event("Page.loadEventFired", session)
        return session

    def requests(self, session):
        """The URLs the page asked for and those that failed, from the Network events so far."""
        asked = [m["params"]["request"]["url"] for m in self.events
                 if m.get("sessionId") == session and m.get("method") == "Network.requestWillBeSent"]
        failed = [m["params"] for m in self.events
                  if m.get("sessionId") == session and m.get("method") == "Network.loadingFailed"]
        return asked, failed

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
  const out = {tables: [], images: [], stray: [], pre: document.querySelectorAll('pre').length,
               h1: [...document.querySelectorAll('h1')].map(e => e.textContent), charts: [], ids: {},
               paragraphs: {}};
  for (const e of document.querySelectorAll('[id]')) out.ids[e.id] = (out.ids[e.id] || 0) + 1;
  for (const p of document.querySelectorAll('p')) {
    let h = p.previousElementSibling;
    while (h && h.tagName !== 'H2' && h.tagName !== 'H1') h = h.previousElementSibling;
    const k = h ? h.textContent : '';
    (out.paragraphs[k] = out.paragraphs[k] || []).push(p.textContent);
  }
  for (const c of document.querySelectorAll('span.chart')) {
    const svg = c.querySelector('svg'), r = svg ? svg.getBoundingClientRect() : null;
    out.charts.push({name: c.dataset.chart, svg: !!svg, w: r ? r.width : 0, h: r ? r.height : 0,
                     vbw: svg ? svg.viewBox.baseVal.width : 0, shapes: svg ? svg.querySelectorAll('path,rect,use').length : 0});
  }
  for (const t of document.querySelectorAll('table')) {
    let h = t.previousElementSibling;
    while (h && h.tagName !== 'H2' && h.tagName !== 'H1') h = h.previousElementSibling;
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

# every <text> of each inline chart in the chart's own units (its viewBox), against the viewBox
SVG_JS = r"""(() => [...document.querySelectorAll('span.chart > svg')].map(svg => {
  const vb = svg.viewBox.baseVal, root = svg.getBoundingClientRect();
  const scale = root.width / vb.width, out = {name: svg.parentElement.dataset.chart, width: vb.width,
                                              height: vb.height, texts: 0, outside: []};
  for (const t of svg.querySelectorAll('text')) {
    if (!t.textContent.trim()) continue;
    const r = t.getBoundingClientRect();
    const box = [(r.left - root.left) / scale, (r.top - root.top) / scale,
                 (r.right - root.left) / scale, (r.bottom - root.top) / scale];
    out.texts++;
    if (box[0] < -0.5 || box[1] < -0.5 || box[2] > vb.width + 0.5 || box[3] > vb.height + 0.5)
      out.outside.push({text: t.textContent.trim(), box: box.map(x => Math.round(x))});
  }
  return out;
}))()"""

# the header's figures, in order (the validation's run and a plan without a token budget)
HEADER_KEYS = ["model", "cluster", "GPUs", "layout", "framework", "step time", "tokens/s", "MFU",
               "hardware TFLOP/s per GPU", "pipeline bubble", "days to train", "cost to train", "date",
               "parallax", "figures from"]


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


def screenshots(exe, html, prefix, height=1400):
    """The page at html as PNGs of `height` pixels each, prefix-0.png, prefix-1.png...: to look at a
    report as a reader would (--screenshot HTML PREFIX)."""
    tmp = tempfile.mkdtemp(prefix="px_report_shot_")
    b = Browser(exe, tmp)
    try:
        session = b.open("file://" + os.path.abspath(html))
        full = b.evaluate(session, "document.documentElement.scrollHeight")
        paths = []
        for i, y in enumerate(range(0, full, height)):
            shot = b.call("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": y, "width": 1200, "height": min(height, full - y), "scale": 1}}, session)
            path = f"{prefix}-{i}.png"
            with open(path, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            paths.append(path)
        print("\n".join(paths))
    finally:
        b.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--screenshot":
        screenshots(find_browser(), sys.argv[2], sys.argv[3])
        return
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


def sig3(v):
    """rpt_fmt_sig(v, 3): three significant digits, fixed from 1e-3 up to a million."""
    if v == 0:
        return "0"
    e = f"{v:.2e}"
    exp = int(e.split("e")[1])
    return e if exp < -3 or exp >= 6 else f"{v:.{max(0, 2 - exp)}f}"


def si3(v):
    """The header's counts: 988K, 1.00M, 15.0T."""
    k = 0
    while abs(v) >= 1000 and k < 5:
        v /= 1000
        k += 1
    return sig3(v) + ["", "K", "M", "B", "T", "P"][k]


def charts_of(rdir):
    md = open(os.path.join(rdir, "report.md")).read()
    return re.findall(r"^!\[[^]]*\]\(([^)]+)\.png\)$", md, re.M)


def check_page(b, rdir, what):
    """report.html of rdir: one request (the page itself) and none failed; every chart of report.md
    inline as SVG at its own size, no <img>, no id twice, no chart text cut off. The page's DOM."""
    url = "file://" + os.path.join(rdir, "report.html")
    session = b.open(url)
    page = b.evaluate(session, PAGE_JS)
    asked, failed = b.requests(session)
    if asked != [url] or failed:
        fail(f"{what}: the page asked for {asked} ({len(failed)} failed: {failed}); only itself expected")
    if page["stray"]:
        fail(f"{what}: Markdown left as paragraphs: {page['stray']}")
    charts = charts_of(rdir)
    if page["images"]:
        fail(f"{what}: {len(page['images'])} <img> in the page; the charts must be inline: {page['images']}")
    if [c["name"] for c in page["charts"]] != charts:
        fail(f"{what}: inline charts {[c['name'] for c in page['charts']]} != the charts of report.md {charts}")
    for c in page["charts"]:
        if not c["svg"] or c["vbw"] != 960 or c["w"] < 480 or c["shapes"] < 10:
            fail(f"{what}: chart {c['name']} not drawn: {c}")
    twice = {k: v for k, v in page["ids"].items() if v > 1}
    if twice:
        fail(f"{what}: ids used more than once (the inline charts' ids must be their own): {list(twice)[:10]}")
    for sv in b.evaluate(session, SVG_JS):
        if sv["outside"]:
            fail(f"{what}: {sv['name']}: text cut off at the edge of the {sv['width']}x{sv['height']} "
                 f"chart: {sv['outside']}")
    print(f"  {what}: 1 request, 0 failed; {len(charts)} charts inline ({', '.join(charts)}), "
          f"{len(page['tables'])} tables, {len(page['ids'])} ids all distinct")
    return page


def check_header(page, what, plan, run_json, tokens, price, row=None):
    """The header: the title names model, cluster and GPUs; the table of figures HEADER_KEYS in order,
    each the plan's (and run's) figure as the page formats it."""
    pred = plan["prediction"]
    model, gpus = plan["model"]["name"], plan["gpus"]
    # a CPU profile's ranks are CPU ranks (prof_device_is_cpu: the device named cpu...)
    per = "CPU rank" if plan["profile"]["device"]["name"].startswith("cpu") else "GPU"
    title = [h for h in page["h1"]]
    if len(title) != 1 or not title[0].endswith(f": {model} on {plan['profile']['name']}, {gpus} {per}s"):
        fail(f"{what}: title {title}; expected it to name {model}, the cluster and {gpus} {per}s")
    t = [t for t in page["tables"] if t["heading"] == title[0]]
    if len(t) != 1:
        fail(f"{what}: expected one header table under the title, found {len(t)}")
    rows = dict((r[0], r[1]) for r in t[0]["rows"])
    keys = [r[0] for r in t[0]["rows"]]
    want_keys = [k.replace("GPU", per) for k in HEADER_KEYS]
    if keys != want_keys:
        fail(f"{what}: header rows {keys} != {want_keys}")
    rows = dict((k.replace(per, "GPU"), v) for k, v in rows.items())
    step = pred["time"]["step_s"]
    want = {"model": model, "GPUs": str(gpus),
            "tokens/s": f"{si3(pred['throughput']['tokens_per_s'])} (the whole job; "
                        f"{si3(pred['throughput']['tokens_per_s'] / gpus)} per {per})",
            "MFU": f"{100 * pred['throughput']['mfu']:.1f}% (model FLOPs, recompute not counted, over the dense "
                   "16-bit peak)",
            "hardware TFLOP/s per GPU": f"{sig3(pred['throughput']['tflops_per_gpu'])} (recompute counted)",
            "framework": "Megatron-LM (parallax export writes its settings, and those of the others)"}
    if run_json:
        m = run_json["time"]["step_s_median"]
        want["step time"] = f"{sig3(step)} s predicted, {sig3(m)} s measured ({100 * (m - step) / step:+.1f}%)"
    else:
        want["step time"] = f"{sig3(step)} s predicted"
    bub = pred["time"]["bubble_fraction"]
    want["pipeline bubble"] = (f"{100 * bub:.1f}% of the busiest stage's compute time; "
                               f"{100 * bub / (1 + bub):.1f}% of its pipeline time idle")
    if tokens:
        days = tokens / pred["throughput"]["tokens_per_s"] / 86400
        hours = days * 24 * gpus
        want["days to train"] = f"{sig3(days)} days for {si3(tokens)} tokens ({si3(hours)} GPU-hours)"
        if price:
            want["cost to train"] = f"${si3(hours * price)} at ${sig3(price)} per GPU-hour"
    for k, v in want.items():
        if rows[k] != v:
            fail(f"{what}: header '{k}' is '{rows[k]}', expected '{v}'")
    # a validation's header says which of its rows it describes
    if row is not None and f"; validation row {row} (" not in rows["layout"]:
        fail(f"{what}: header's layout '{rows['layout']}' does not name validation row {row}")
    # the build's git describe: a commit of this checkout's history, HEAD or before it (the binary
    # may predate the last commit); "unknown" outside a git checkout
    src = os.path.dirname(os.path.abspath(__file__))
    head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    commit = rows["parallax"].replace("-dirty", "").rsplit("-g", 1)[-1]
    if head.returncode != 0:
        if rows["parallax"] != "unknown":
            fail(f"{what}: header's commit '{rows['parallax']}' outside a git checkout")
    elif not re.fullmatch(r"[0-9a-f]{7,40}", commit) or subprocess.run(
            ["git", "-C", src, "merge-base", "--is-ancestor", commit, "HEAD"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        fail(f"{what}: header's commit '{rows['parallax']}' is not in this checkout's history")
    if not re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", rows["date"]):
        fail(f"{what}: header's date '{rows['date']}'")
    print(f"  {what} header: {len(keys)} figures; step {rows['step time']}; {rows['days to train']}; "
          f"parallax {rows['parallax']}")


def check_host(page, what, validation):
    """The Host check section as validation (its host_check and quiet objects) says, or says absent."""
    paras = page["paragraphs"].get("Host check", [])
    tables = [t for t in page["tables"] if t["heading"] == "Host check"]
    h, q = validation.get("host_check"), validation.get("machine")
    want_tables = []
    if h and h.get("probed"):
        def row(name, now, ref):
            return [name, sig3(h[now] / 1e9), sig3(h[ref] / 1e9), f"{100 * (h[now] - h[ref]) / h[ref]:+.1f}%"]
        want_tables.append([row("GEMM (GFLOP/s)", "peak_flops", "peak_flops_calibrated"),
                            row("memory bandwidth (GB/s)", "memory_bandwidth", "memory_bandwidth_calibrated")])
    elif "No host check was made (--no-host-check, or the profile is not calibrated): nothing says whether " \
         "this host still runs at its calibrated rates." not in paras:
        fail(f"{what}: the Host check does not say that none was made: {paras}")
    if q:
        def val(k):
            return sig3(q[k]) if isinstance(q.get(k), (int, float)) and not isinstance(q.get(k), bool) \
                else "not reported"
        want_tables.append([["load (1-minute average)", val("load")],
                            ["other processes' CPU time during the timed runs (s)", val("other_cpu_s")],
                            ["steal time (s)", val("steal_s")]])
        if q["quiet"] is False:
            want = (f"Not graded: the machine was not quiet. {q['verdict']} The measured times include the "
                    "other load, so the rows' errors are not parallax's.")
            if want not in paras:
                fail(f"{what}: a busy machine's Host check lacks '{want}': {paras}")
    elif "No quiet check was recorded: nothing says whether other processes shared the machine during " \
         "the timed runs." not in paras:
        fail(f"{what}: the Host check does not say that no quiet check was recorded: {paras}")
    got = [t["rows"] for t in tables]
    if got != want_tables:
        fail(f"{what}: Host check tables {got} != {want_tables}")
    print(f"  {what} host check: {len(tables)} tables, {len(paras)} paragraphs as validate's JSON says")


def check(px, max_ranks, exe, tmp):
    env = dict(os.environ, PARALLAX_UNCALIBRATED="1", PARALLAX_PROFILE_DIR=os.path.join(tmp, "none"))
    rdir = os.path.join(tmp, "v")
    out = run([px, "validate", "--model", "tiny", "--steps", "3", "--max-ranks", max_ranks,
               "--report", rdir, "--json"], env, os.path.join(tmp, "validate.err"))
    validation = json.loads(out)
    layouts = validation["layouts"]
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
    plan = json.load(open(plan_path))
    stages = len(plan["prediction"]["memory"]["per_stage"])
    blocks = scaling_dat(os.path.join(rdir, "scaling.dat"))
    sizes = sorted(set(blocks[0]) | set(blocks[1]))
    sharded = scaling_dat(os.path.join(rdir, "scaling_sharded.dat"))
    sharded_sizes = sorted(set(sharded[0]) | set(sharded[1]))

    # a report of the same plan and run with a host check that drifted and a busy machine, and a
    # 70B plan with interleaving (tp 4, pp 8, vpp 5) with a token budget and a price
    fixture = {"host_check": {"probed": True, "peak_flops": 1.2e11, "peak_flops_calibrated": 1e11,
                              "memory_bandwidth": 9.5e9, "memory_bandwidth_calibrated": 1e10,
                              "drifted": True, "recalibrated": False},
               "machine": {"quiet": False, "load": 3.2, "other_cpu_s": 41.0, "steal_s": None,
                         "verdict": "another process used 41 s of CPU during the timed runs."}}
    fix_path = os.path.join(tmp, "validation.json")
    json.dump(fixture, open(fix_path, "w"))
    hdir = os.path.join(tmp, "h")
    run([px, "report", "--plan", plan_path, "--run", run_path, "--validation", fix_path, "--tokens", "1e9",
         "--gpu-hour-price", "2", "--dir", hdir], env, os.path.join(tmp, "report-h.err"))
    p70 = os.path.join(tmp, "plan70.json")
    run([px, "plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "1024", "--gbs", "1024",
         "--seq", "8192", "--tp", "4", "--pp", "8", "--vpp", "5", "--tokens", "15e12", "-o", p70], env,
        os.path.join(tmp, "plan70.err"))
    d70 = os.path.join(tmp, "r70")
    err70 = os.path.join(tmp, "report-70.err")
    run([px, "report", "--plan", p70, "--gpu-hour-price", "2.5", "--dir", d70], env, err70)
    progress = open(err70).read().splitlines()
    want = ["report: memory per pipeline stage (the plan's prediction)",
            "report: pipeline timeline (re-simulating the plan)",
            "report: pages: report.md and report.html (charts inline)"]
    if progress != want:
        fail(f"report's progress on standard error {progress} != {want}")
    print(f"  report progress off a terminal: {len(progress)} lines, one per phase")

    b = Browser(exe, tmp)
    try:
        page = check_page(b, rdir, "validation")
        check_header(page, "validation", plan, json.load(open(run_path)), 0, 0, pick)
        check_host(page, "validation", validation)
        t = table(page["tables"], "Validation: predicted against measured")
        expect_rows("validation", t, len(layouts), f"{len(layouts)} layouts in validate --json")
        got = [(r[0], r[2]) for r in t["rows"]]
        want = [(str(l["index"]), l["layout"]) for l in layouts]
        if got != want:
            fail(f"validation table's numbers and layouts {got} != validate --json's {want}")
        t = table(page["tables"], "Predicted against measured")
        if t["header"] != ["quantity", "unit", "predicted", "measured",
                           "error: (measured - predicted) / predicted"]:
            fail(f"compare table's columns {t['header']}")
        expect_rows("predicted against measured", t, len(shown),
                    f"{len(shown)} of the {len(rows)} quantities of compare --json, "
                    f"{len(rows) - len(shown)} ops under 1% of the step left out")
        got = [r[0] for r in t["rows"]]
        if got != [r["quantity"] for r in shown]:
            fail(f"compare table's quantities {got} != compare --json's {[r['quantity'] for r in shown]}")
        t = table(page["tables"], "Memory per pipeline stage")
        expect_rows("memory", t, min(stages, 9), f"{stages} pipeline stages in plan-{pick:02d}.json")
        t = table(page["tables"], "Scaling")
        if t["header"] != ["GPUs", "strong: best layout", "hardware TFLOP/s per GPU", "MFU",
                           "weak: global batch (sequences)", "hardware TFLOP/s per GPU", "MFU"]:
            fail(f"scaling table's columns {t['header']}")
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
        if t["header"] != ["GPUs", "ZeRO-3: layout", "step (s)", "exposed data-parallel comm. (s per step)",
                           "hardware TFLOP/s per GPU", "MFU", "3D: layout", "step (s)",
                           "hardware TFLOP/s per GPU", "MFU"]:
            fail(f"sharded table's columns {t['header']}")
        if not any("recompute included" in p for p in page["paragraphs"]["Sharded data parallelism against 3D"]):
            fail("the sharded table does not say that its TFLOP/s count recompute")
        expect_rows("sharded", t, len(sharded_sizes), f"{len(sharded_sizes)} GPU counts in scaling_sharded.dat")
        for r in t["rows"]:
            for col, block in ((4, sharded[0]), (8, sharded[1])):
                want = block.get(int(r[0]))
                if want is None:
                    continue
                if abs(float(r[col]) - want) > 0.005 * abs(want):
                    fail(f"sharded table, {r[0]} GPUs: TFLOP/s per GPU {r[col]}, scaling_sharded.dat {want}")
        print(f"  sharded: TFLOP/s per GPU {[r[4] for r in t['rows']]} (ZeRO-3) "
              f"{[r[8] for r in t['rows']]} (3D) agree with scaling_sharded.dat")
        bubble = [p for p in page["paragraphs"]["Pipeline timeline"] if "bubble" in p]
        if len(bubble) != 1 or "exceeds 100%" not in bubble[0]:
            fail(f"the timeline does not define the bubble it prints: {page['paragraphs']['Pipeline timeline']}")
        n_tables = 6 + (1 if validation.get("host_check", {}).get("probed") else 0) + \
            (1 if validation.get("machine") else 0)
        if len(page["tables"]) != n_tables:
            fail(f"{len(page['tables'])} tables in the page, {n_tables} expected")

        page = check_page(b, hdir, "busy host")
        check_header(page, "busy host", plan, json.load(open(run_path)), 1e9, 2)
        check_host(page, "busy host", fixture)
        if "Not graded: the host had drifted from its calibration: the predictions use the calibrated rates, " \
           "so the errors below include the drift (parallax validate --recalibrate calibrates again first)." \
                not in page["paragraphs"]["Host check"]:
            fail(f"the drifted host check is not said: {page['paragraphs']['Host check']}")

        plan70 = json.load(open(p70))
        page = check_page(b, d70, "70B")
        check_header(page, "70B", plan70, None, 15e12, 2.5)
        sim = [l for l in open(os.path.join(d70, "timeline.dat")) if l.strip()]
        per_track = collections.Counter(int(l.split()[0]) for l in sim)
        full = 2 * 5 * plan70["training"]["global_batch"] // plan70["layout"]["dp"] // \
            plan70["training"].get("micro_batch", 1)
        if sorted(per_track) != list(range(8)) or max(per_track.values()) > 64:
            fail(f"70B timeline: bars per stage {dict(per_track)}; 8 stages of at most 64 expected "
                 f"(the whole step has {full} a stage)")
        print(f"  70B timeline: 8 rows of {min(per_track.values())} to {max(per_track.values())} bars "
              f"(the whole step: {full} a row)")
    finally:
        b.close()
    print("report_browser: passed")


if __name__ == "__main__":
    main()
