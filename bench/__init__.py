"""Side-by-side benchmarks: Waypoint vs LangGraph (docs/performance.md has the workloads and figures).

Run everything with ``python -m bench.run_all`` (what ``make bench`` calls) from the project root.
Every figure is a median over separate fresh processes, each of which warms up once and reports
the median of several timed invocations; see ``bench._harness``.
"""
