"""The lab report: a self-contained HTML page built from a lab folder's results.json files and PNGs.

``build_report(lab_dir)`` writes ``lab_dir/report.html`` (see :mod:`poslab.lab.report.builder`);
:mod:`poslab.lab.report.claims` checks the lessons' claims against the results;
:mod:`poslab.lab.report.i18n` holds every string of the page in English and Chinese (``lang="zh"``);
:mod:`poslab.display.fonts` ships the CJK font used by the figures and the page.
"""

from poslab.lab.report.builder import build_report, machine_info
from poslab.lab.report.reading import load_results

__all__ = ["build_report", "load_results", "machine_info"]
