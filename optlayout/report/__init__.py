"""Reports people look at: self-contained HTML pages (inline CSS and SVG, no network) for a plan and a compare.

html = plan_report_html(plan, topology)       # optlayout solve --report FILE
html = compare_report_html(result)            # optlayout compare --report FILE (the --json dict)
write_report(html, "report.html")
"""

from optlayout.report.compare_report import compare_report_html
from optlayout.report.html import write_report
from optlayout.report.plan_report import plan_report_html

__all__ = ["compare_report_html", "plan_report_html", "write_report"]
