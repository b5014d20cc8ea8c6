"""The lab report: a self-contained HTML page built from a lab folder's results.json files and PNGs.

``build_report(lab_dir)`` writes ``lab_dir/report.html`` (see :mod:`poslab.report.builder`);
:mod:`poslab.report.claims` checks the lessons' claims against the results;
:mod:`poslab.report.fonts` ships the CJK font used by the figures and the page.
"""

from poslab.report.builder import build_report, load_results, machine_info

__all__ = ["build_report", "load_results", "machine_info"]
