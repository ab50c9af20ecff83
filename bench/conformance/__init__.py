"""
Outside conformance suites (pjdfstest, fsx, fsstress) against a real svc
mount: C{scripts/conformance} runs C{python -m bench.conformance}. Not a
test of the suite: never run by C{scripts/test} or CI. What it does and the
documented expected pjdfstest failures: C{docs/conformance.md}.
"""
