"""Reports: figures (matplotlib, Agg) and one self-contained HTML file.

Plotting only: results come from :mod:`datarecon.evaluation`.
"""

from datarecon.report.figures import (
    LANDSCAPE_SETS,
    figure_png,
    interpolation_curves,
    landscape_heatmaps,
    neighbour_grid,
    roc_curves,
    save_figure,
    sorted_ssim_curve,
    ssim_vs_margin,
)
from datarecon.report.html import (
    FigureItem,
    Section,
    Table,
    landscape_results,
    render_html,
    render_report,
    write_report,
)

__all__ = [
    "LANDSCAPE_SETS", "FigureItem", "Section", "Table", "figure_png", "interpolation_curves",
    "landscape_heatmaps", "landscape_results", "neighbour_grid", "render_html", "render_report",
    "roc_curves", "save_figure", "sorted_ssim_curve", "ssim_vs_margin", "write_report",
]
