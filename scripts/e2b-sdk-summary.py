#!/usr/bin/env python3
"""The results of scripts/e2b-sdk-tests, per test file and in total.

  e2b-sdk-summary.py report [--py JUNIT.xml]... [--js VITEST.json]...
                            [--expected FILE] [--tsv OUT] [--js-root DIR]
                            [--failures N]
  e2b-sdk-summary.py rerun-js --js-root DIR VITEST.json...

`report` reads pytest's junit xml (junit_family=xunit1) and vitest's json
reports, of the offline phase and of the live one (their file names say
which: *offline* or *live*). A test's result is its offline pass or skip
if it had one, else its live result, else its offline one. A failure
whose id matches a pattern of --expected (e2b-sdk-expected.txt) is counted
apart, as one that cannot pass here, with its reason. Exit status 1 when
any other test failed.

Test ids: `py:tests/sync/sandbox_sync/test_create.py::test_start` (pytest's
node id, relative to packages/python-sdk) and `js:tests/sandbox/create.test.ts >
create` (the file, relative to packages/js-sdk, then the describe blocks
and the test's title, joined by ` > `); a JS file that failed as a whole
is `js:FILE > (file)`.

`rerun-js` prints the JS files (relative to DIR) with a test that did not
pass or a failure of their own: the live phase's files.
"""

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import OrderedDict, defaultdict

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def first_line(text, limit=200):
    text = ANSI.sub("", text or "").strip()
    line = next((l.strip() for l in text.splitlines() if l.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def phase_of(path):
    name = os.path.basename(path)
    return "live" if "live" in name else "offline"


def read_junit(path):
    """(id, file, status, message) of each testcase of a pytest junit xml."""
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        file = case.get("file")
        if file:
            module = file[:-3].replace("/", ".") if file.endswith(".py") else file
            rest = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
            parts = [p for p in rest.split(".") if p] + [name]
            nodeid = file + "::" + "::".join(parts)
        else:
            # A module that failed to collect: name is its dotted path.
            file = name.replace(".", "/") + ".py" if name and "/" not in name else name
            nodeid = file
        status, message = PASSED, ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = FAILED
                message = child.get("message") or child.text or child.tag
                break
            if child.tag == "skipped":
                status, message = SKIPPED, child.get("message") or ""
        yield "py:" + nodeid, "py " + file, status, first_line(message)


def rel_js(path, js_root):
    if js_root:
        try:
            rel = os.path.relpath(path, js_root)
            if not rel.startswith(".."):
                return rel
        except ValueError:
            pass
    i = path.rfind("/tests/")
    return path[i + 1 :] if i >= 0 else path


def read_vitest(path, js_root):
    """(id, file, status, message) of each test of a vitest json report."""
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    for result in report.get("testResults", []):
        file = rel_js(result.get("name", "?"), js_root)
        assertions = result.get("assertionResults", [])
        for a in assertions:
            status = a.get("status")
            status = PASSED if status == "passed" else FAILED if status == "failed" else SKIPPED
            title = " > ".join(list(a.get("ancestorTitles", [])) + [a.get("title", "")])
            message = "\n".join(a.get("failureMessages") or [])
            yield "js:" + file + " > " + title, "js " + file, status, first_line(message)
        # A failure outside any test (an import, a hook): the file's own.
        if result.get("status") == "failed" and (
            not assertions or not any(a.get("status") == "failed" for a in assertions)
        ):
            yield "js:" + file + " > (file)", "js " + file, FAILED, first_line(result.get("message"))


def read_expected(path):
    """[(regex, tag)], {tag: reason} of an e2b-sdk-expected.txt."""
    patterns, reasons, tag = [], {}, None
    if not path:
        return patterns, reasons
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^\[([\w.-]+)\]\s*(.*)$", line)
            if m:
                tag = m.group(1)
                reasons[tag] = m.group(2)
                continue
            if tag is None:
                sys.exit(f"{path}:{n}: a test id before any [reason] line")
            regex = "^" + ".*".join(re.escape(p) for p in line.split("*")) + "$"
            patterns.append((re.compile(regex), tag))
    return patterns, reasons


def merge(records):
    """id -> (file, status, phase, message): offline pass > live > offline."""
    best = OrderedDict()
    rank = lambda phase, status: 0 if (phase == "offline" and status != FAILED) else 1 if phase == "live" else 2
    for phase, (tid, file, status, message) in records:
        cur = best.get(tid)
        if cur is None or rank(phase, status) < rank(cur[2], cur[1]):
            best[tid] = (file, status, phase, message)
    return best


def report(args):
    records = []
    for path in args.py:
        records += [(phase_of(path), r) for r in read_junit(path)]
    for path in args.js:
        records += [(phase_of(path), r) for r in read_vitest(path, args.js_root)]
    results = merge(records)
    patterns, reasons = read_expected(args.expected)

    def expected_tag(tid):
        return next((tag for rx, tag in patterns if rx.match(tid)), None)

    per_file = defaultdict(lambda: defaultdict(int))
    totals = {lang: defaultdict(int) for lang in ("py", "js")}
    failures, cannot, by_reason, listed_but_passed = [], [], defaultdict(int), []
    rows = []
    for tid, (file, status, phase, message) in results.items():
        lang = tid[:2]
        tag = expected_tag(tid)
        outcome = status
        if status == FAILED and tag:
            outcome = "expected"
            by_reason[tag] += 1
            cannot.append(tid)
        elif status == FAILED:
            failures.append((tid, phase, message))
        elif status == PASSED:
            totals[lang][f"passed-{phase}"] += 1
            if tag and phase == "live":
                listed_but_passed.append(tid)
        per_file[file][outcome] += 1
        totals[lang][outcome] += 1
        rows.append((tid, outcome, phase, tag or "", message))

    cols = (PASSED, FAILED, "expected", SKIPPED)
    heads = ("pass", "fail", "n/a", "skip")
    width = max([len(f) for f in per_file] + [40])
    out = sys.stdout
    print(f"{'test file':<{width}}  " + " ".join(f"{h:>5}" for h in heads), file=out)
    for file in sorted(per_file):
        counts = per_file[file]
        mark = "  <-" if counts[FAILED] else ""
        print(f"{file:<{width}}  " + " ".join(f"{counts[c]:>5}" for c in cols) + mark, file=out)
    print("(n/a: failed, and e2b-sdk-expected.txt says it cannot pass here)", file=out)
    print(file=out)
    grand = defaultdict(int)
    for lang, name in (("py", "Python"), ("js", "JS")):
        t = totals[lang]
        n = sum(t[c] for c in cols)
        if not n:
            continue
        for c in cols:
            grand[c] += t[c]
        print(
            f"{name:<7}{n:>5} tests: {t[PASSED]} passed ({t['passed-offline']} offline, "
            f"{t['passed-live']} live), {t[FAILED]} failed, {t['expected']} cannot pass here, "
            f"{t[SKIPPED]} skipped",
            file=out,
        )
    n = sum(grand[c] for c in cols)
    print(
        f"{'Total':<7}{n:>5} tests: {grand[PASSED]} passed, {grand[FAILED]} failed, "
        f"{grand['expected']} cannot pass here, {grand[SKIPPED]} skipped",
        file=out,
    )
    if by_reason:
        print(
            "Cannot pass here, by reason: "
            + ", ".join(f"{tag} {by_reason[tag]}" for tag in sorted(by_reason)),
            file=out,
        )
    if listed_but_passed:
        print(
            f"Listed in e2b-sdk-expected.txt but passed live ({len(listed_but_passed)}): "
            + ", ".join(listed_but_passed[:10])
            + (" …" if len(listed_but_passed) > 10 else ""),
            file=out,
        )
    if failures:
        failures.sort()
        shown = failures[: args.failures]
        print(f"\nFailures ({len(shown)} of {len(failures)}" + (", all in --tsv" if args.tsv else "") + "):", file=out)
        for tid, phase, message in shown:
            print(f"  {tid} [{phase}]\n      {message}", file=out)
    if args.tsv:
        with open(args.tsv, "w", encoding="utf-8") as f:
            f.write("id\toutcome\tphase\treason\tmessage\n")
            for row in rows:
                f.write("\t".join(str(x).replace("\t", " ") for x in row) + "\n")
        print(f"\nEvery test: {args.tsv}", file=out)
    return 1 if failures else 0


def rerun_js(args):
    files = OrderedDict()
    for path in args.reports:
        for tid, file, status, _ in read_vitest(path, args.js_root):
            if status == FAILED:
                files[file[3:]] = True
    for file in files:
        print(file)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report")
    r.add_argument("--py", action="append", default=[], help="a pytest junit xml")
    r.add_argument("--js", action="append", default=[], help="a vitest json report")
    r.add_argument("--expected", help="e2b-sdk-expected.txt")
    r.add_argument("--tsv", help="write every test's result here")
    r.add_argument("--js-root", help="packages/js-sdk of the run")
    r.add_argument("--failures", type=int, default=40, help="failures to list (default 40)")
    j = sub.add_parser("rerun-js")
    j.add_argument("--js-root")
    j.add_argument("reports", nargs="*")
    args = parser.parse_args()
    return report(args) if args.command == "report" else rerun_js(args)


if __name__ == "__main__":
    sys.exit(main())
