#!/usr/bin/env python3
"""Sums Bazel's JUnit XML test results into one closing line: `tests: N passed, M failed, K skipped`.

usage: test_summary.py [--bep BEP.json] [--testlogs DIR] [--junit E2E.xml ...]

Each <testcase> counts once: with a <failure> or <error> child it failed, with a <skipped> child it was
skipped (the reason is printed), otherwise it passed. pytest tests (tools/pytest_runner.py) write one
testcase per test function; for other tests (cc_test, sh_test) Bazel writes one testcase per target.

With --bep (a file from `bazel test --build_event_json_file=...`) exactly the tests of that run are
counted, cached ones included, and a test target that produced no result (it failed to build, say)
counts as failed; otherwise every bazel-testlogs/**/test.xml is read (stale ones of deleted tests too).

--junit adds pytest JUnit files run outside Bazel (make test's tests/e2e); a missing one counts as a failure.
--json also writes the counts, and with --started (make test passes its start) the run's wall time: make test writes
out/make_test.json, which `python -m benchmarks.docs --publish out/make_test.json` publishes for docs/testing.md.

Exit status: 1 if anything failed or no test ran at all, else 0.
"""
import argparse
import glob
import json
import os
import sys
import time
import urllib.parse
import xml.etree.ElementTree as ET


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = []  # (test, why)
        self.skipped = []  # (test, reason)

    def add_xml(self, label, path):
        """Adds the testcases of one test.xml; returns False if it could not be read."""
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            return False
        for case in root.iter("testcase"):
            name = case.get("name", "?")
            cls = case.get("classname")
            test = "%s::%s" % (label, "%s.%s" % (cls, name) if cls else name)
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            skip = case.find("skipped")
            if bad is not None:
                self.failed.append((test, _first_line(bad.get("message") or bad.text or bad.tag)))
            elif skip is not None:
                self.skipped.append((test, _first_line(skip.get("message") or skip.text or "no reason given")))
            else:
                self.passed += 1
        return True


def _first_line(text):
    text = " ".join(text.strip().split("\n")[:1])
    return text if len(text) <= 300 else text[:297] + "..."


def _label_from_testlog(testlogs, xml_path):
    pkg_and_name = os.path.relpath(os.path.dirname(xml_path), testlogs)
    # Sharded / repeated runs: .../<name>/shard_1_of_2/test.xml, .../<name>/run_1_of_3/test.xml
    parts = pkg_and_name.split(os.sep)
    while parts and (parts[-1].startswith("shard_") or parts[-1].startswith("run_")):
        parts.pop()
    return "//%s:%s" % ("/".join(parts[:-1]), parts[-1]) if parts else pkg_and_name


def from_testlogs(tally, testlogs):
    for xml in sorted(glob.glob(os.path.join(testlogs, "**", "test.xml"), recursive=True)):
        label = _label_from_testlog(testlogs, xml)
        if not tally.add_xml(label, xml):
            tally.failed.append((label, "unreadable test.xml"))


def from_bep(tally, bep_path):
    tests = {}  # label -> kind, for every configured test target
    results = {}  # (label, run, shard) -> (attempt, status, test.xml path)
    skipped_targets = {}  # label -> why (incompatible targets)
    with open(bep_path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            ev = json.loads(line)
            eid = ev.get("id", {})
            if "targetConfigured" in eid and "configured" in ev:
                conf = ev["configured"]
                if "testSize" in conf or conf.get("targetKind", "").endswith("_test rule"):
                    tests[eid["targetConfigured"]["label"]] = conf.get("targetKind", "")
            elif "testResult" in eid and "testResult" in ev:
                rid, res = eid["testResult"], ev["testResult"]
                key = (rid["label"], rid.get("run", 1), rid.get("shard", 1))
                attempt = rid.get("attempt", 1)
                xml = None
                for out in res.get("testActionOutput", []):
                    if out.get("name") == "test.xml" and out.get("uri", "").startswith("file://"):
                        xml = urllib.parse.unquote(urllib.parse.urlparse(out["uri"]).path)
                if key not in results or results[key][0] <= attempt:
                    results[key] = (attempt, res.get("status", "NO_STATUS"), xml)
            elif "aborted" in ev:
                ab = ev["aborted"]
                target = eid.get("targetCompleted") or eid.get("targetConfigured") or eid.get("configuredLabel")
                label = (target or {}).get("label")
                if label and ab.get("reason") == "SKIPPED":
                    why = ab.get("description") or "skipped by Bazel"
                    skipped_targets[label] = "not built for this platform (target_compatible_with): " + why

    with_result = set()
    for (label, run, shard), (_attempt, status, xml) in sorted(results.items()):
        with_result.add(label)
        before = len(tally.failed)
        if xml is None or not tally.add_xml(label, xml):
            tally.failed.append((label, "no test.xml (status %s)" % status))
        elif status != "PASSED" and len(tally.failed) == before:
            # e.g. a timeout or crash after the XML was written: the target failed all the same.
            tally.failed.append((label, "status %s" % status))
    for label in sorted(tests):
        if label in with_result:
            continue
        if label in skipped_targets:
            tally.skipped.append((label, skipped_targets[label]))
        else:
            tally.failed.append((label, "no test result (did it fail to build?)"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bep", help="build event JSON file of the `bazel test` run")
    ap.add_argument("--testlogs", default="bazel-testlogs", help="Bazel testlogs dir (without --bep)")
    ap.add_argument("--junit", action="append", default=[], help="a pytest JUnit XML file (tests outside Bazel)")
    ap.add_argument("--started", type=float, help="when the run began (seconds since the epoch): its wall time goes to "
                                                  "--json")
    ap.add_argument("--json", help="also write the counts (and with --started the wall time) here")
    args = ap.parse_args()

    tally = Tally()
    if args.bep and os.path.exists(args.bep):
        from_bep(tally, args.bep)
    else:
        if args.bep:
            print("test_summary: %s missing, reading %s" % (args.bep, args.testlogs), file=sys.stderr)
        from_testlogs(tally, args.testlogs)
    for path in args.junit:
        if not tally.add_xml(os.path.basename(path), path):
            tally.failed.append((path, "missing or unreadable (pytest did not run?)"))

    if tally.skipped:
        print("Skipped tests (%d):" % len(tally.skipped))
        for test, reason in tally.skipped:
            print("  SKIPPED %s: %s" % (test, reason))
    if tally.failed:
        print("Failed tests (%d):" % len(tally.failed))
        for test, why in tally.failed:
            print("  FAILED %s: %s" % (test, why))
    total = tally.passed + len(tally.failed) + len(tally.skipped)
    if total == 0:
        print("test_summary: no test ran", file=sys.stderr)
    sys.stdout.flush()
    print("tests: %d passed, %d failed, %d skipped" % (tally.passed, len(tally.failed), len(tally.skipped)))
    if args.json:  # what `benchmarks.docs --publish out/make_test.json` takes (docs/testing.md renders it)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"passed": tally.passed, "failed": len(tally.failed), "skipped": len(tally.skipped),
                       "wall_s": None if args.started is None else round(time.time() - args.started),
                       "cpu_count": os.cpu_count(), "command": "make test"}, f, indent=1)
            f.write("\n")
    return 1 if tally.failed or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
