"""`edgefl report`: runs (emulated or served) as one static HTML page with PNG plots.

`runs` (what a run folder holds and what is derived from it), `plots` (one figure per function), `html` (the
page around them), `page` (the report: `write_report`).
"""
from edgefl import lazy_exports

_WHERE = {"write_report": ".page", "Run": ".runs", "load_run": ".runs"}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
