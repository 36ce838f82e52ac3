"""Trace analysis: where a training step's time goes, from torch.profiler Chrome traces (`optlayout profile`)."""

from optlayout.trace.analysis import (
    OpTime,
    Overlap,
    ProfileReport,
    RankTime,
    TraceStream,
    TraceSummary,
    analyze,
    categorize,
    iter_trace_events,
    summarize_trace,
)

__all__ = [
    "OpTime",
    "Overlap",
    "ProfileReport",
    "RankTime",
    "TraceStream",
    "TraceSummary",
    "analyze",
    "categorize",
    "iter_trace_events",
    "summarize_trace",
]
