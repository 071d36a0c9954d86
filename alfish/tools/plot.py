"""Learning curves of alfish runs, drawn to a PNG or SVG file.

    python -m alfish.tools.plot --run sac=runs/sac-s1,runs/sac-s2 --run td3='runs/td3-*' -o curves.png
    python -m alfish.tools.plot runs/sac-s1 --tag eval/average_return --x iteration -o curve.svg
    python -m alfish.tools.plot --run sac='runs/sac-*' --iqm --size 8 5 --dpi 150 -o iqm.png

Each --run LABEL=DIR[,DIR...] is one configuration (a DIR may be a quoted glob pattern); a DIR named without --run is
one of its own, labelled by its path. A configuration's runs (its seeds) are interpolated onto one x grid where all
of them have data and drawn as their mean with a band: --band minmax (default; the runs' range) or std (the mean ±
the runs' standard deviation). With --iqm they are drawn instead as their interquartile mean with a 95% percentile
bootstrap confidence interval over runs, as rliable reports it (Agarwal et al. 2021).

The curve is eval_log.jsonl's average_return (--field: another of its numbers, e.g. average_episode_length) or a
TensorBoard scalar (--tag eval/average_return); the x axis is --x env_steps (default), iteration or wall_clock
(seconds: the eval log's elapsed_s, or TensorBoard's time since the run's first event).

Needs matplotlib: pip install 'alfish[plot]'. Reads JSON and TensorBoard events only from the results directories.
Exit status: 0, or 2 with one error line.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Optional, Sequence

import numpy as np

from alfish.tools.cli import ToolError, report
from alfish.tools.runs import X_AXES, X_LABELS, Group, groups_from_args, read_group, tool_parser
from alfish.tools.stats import BANDS, align, bootstrap_ci, iqm, mean_band

FORMATS = (".png", ".svg")
BAND_ALPHA = 0.25  # the band's opacity: the curves of other groups stay visible through it
_PLOT_EXTRA = "pip install 'alfish[plot]'"


@dataclasses.dataclass(frozen=True)
class Series:
    """One group as drawn: x ``[G]``, its center line and band edges (each ``[G]``), and its number of runs."""

    label: str
    runs: int
    x: np.ndarray
    center: np.ndarray
    low: np.ndarray
    high: np.ndarray


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = tool_parser("plot", __doc__, ", on its own",
                         "a configuration's runs (seeds), drawn as one curve with a band")
    parser.add_argument("-o", "--output", required=True, help="the figure to write: .png or .svg")
    parser.add_argument("--tag", default=None, help="a TensorBoard scalar to draw instead of the eval log")
    parser.add_argument("--field", default="average_return", help="the eval log's number to draw (without --tag)")
    parser.add_argument("--x", default="env_steps", choices=X_AXES, help="the x axis")
    parser.add_argument("--band", default="minmax", choices=BANDS, help="the band around the mean over runs")
    parser.add_argument("--iqm", action="store_true",
                        help="draw the interquartile mean over runs with a bootstrap confidence interval instead")
    parser.add_argument("--confidence", type=float, default=0.95, help="--iqm's confidence level")
    parser.add_argument("--reps", type=int, default=2000, help="--iqm's bootstrap repetitions")
    parser.add_argument("--size", type=float, nargs=2, default=(6.4, 4.0), metavar=("W", "H"),
                        help="figure size in inches")
    parser.add_argument("--dpi", type=float, default=100.0, help="pixels per inch (a PNG is W*dpi x H*dpi pixels)")
    parser.add_argument("--xlim", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"))
    parser.add_argument("--ylim", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"))
    parser.add_argument("--title", default=None)
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """What argparse cannot check, before any run is read. Raises ToolError."""
    if not args.output.lower().endswith(FORMATS):
        raise ToolError(f"--output {args.output!r} must end with {' or '.join(FORMATS)}")
    if min(args.size) <= 0 or args.dpi <= 0:
        raise ToolError(f"--size {args.size[0]:g} {args.size[1]:g} and --dpi {args.dpi:g} must be > 0")
    if not 0.0 < args.confidence < 1.0 or args.reps < 1:
        raise ToolError(f"--confidence {args.confidence:g} must be in (0, 1) and --reps {args.reps} >= 1")
    matplotlib_parts()


def matplotlib_parts() -> tuple[Any, Any]:
    """``(Figure, FigureCanvasAgg)``: figures drawn without pyplot on the Agg canvas, so no display is needed and no
    global backend is switched. Raises ToolError when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ToolError(f"plot needs matplotlib, which is not installed: {_PLOT_EXTRA}") from None
    return Figure, FigureCanvasAgg


def series_of(group: Group, args: argparse.Namespace) -> Series:
    """``group``'s runs read, aligned on their common x grid and summarized over runs as ``args`` asks."""
    curves = read_group(group, args.x, args.tag, args.field)
    try:
        x, values = align([c.x for c in curves], [c.y for c in curves])
    except ValueError as err:
        raise ToolError(f"{group.label}: {err}") from None
    if args.iqm:
        center = iqm(values)
        low, high = bootstrap_ci(values, iqm, reps=args.reps, confidence=args.confidence)
    else:
        center, low, high = mean_band(values, args.band)
    return Series(group.label, len(curves), x, center, low, high)


def draw(series: Sequence[Series], args: argparse.Namespace) -> Any:
    """The figure (a matplotlib ``Figure`` on an Agg canvas, ``args.size`` inches at ``args.dpi``)."""
    figure_cls, canvas_cls = matplotlib_parts()
    fig = figure_cls(figsize=tuple(args.size), dpi=args.dpi)
    canvas_cls(fig)
    ax = fig.add_subplot()
    for s in series:
        [line] = ax.plot(s.x, s.center, label=f"{s.label} (n={s.runs})", marker="o" if len(s.x) == 1 else None)
        ax.fill_between(s.x, s.low, s.high, color=line.get_color(), alpha=BAND_ALPHA, linewidth=0)
    ax.set_xlabel(X_LABELS[args.x])
    ax.set_ylabel(args.tag or args.field)
    if args.xlim:
        ax.set_xlim(*args.xlim)
    if args.ylim:
        ax.set_ylim(*args.ylim)
    if args.title:
        ax.set_title(args.title)
    ax.grid(alpha=0.3)
    summary = (f"IQM, {args.confidence:.0%} bootstrap CI" if args.iqm
               else f"mean, {'min-max' if args.band == 'minmax' else '± std'} band")
    ax.legend(title=summary, fontsize="small", title_fontsize="small")
    fig.tight_layout()
    return fig


def save(fig: Any, path: str) -> None:
    """Write ``fig`` to ``path`` (its format from the suffix) at the figure's own dpi, so a PNG is exactly
    ``size * dpi`` pixels. Raises ToolError if it cannot be written."""
    try:
        fig.savefig(path, dpi=fig.dpi)
    except OSError as err:
        raise ToolError(f"cannot write {path}: {err.strerror or err}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
        series = [series_of(group, args) for group in groups_from_args(args.run, args.dirs)]
        fig = draw(series, args)
        save(fig, args.output)
    except ToolError as err:
        return report(err)
    width, height = args.size
    shape = (f"{round(width * args.dpi)}x{round(height * args.dpi)} px" if args.output.lower().endswith(".png")
             else f"{width:g}x{height:g} in")
    print(f"wrote {os.path.abspath(args.output)} ({shape}): "
          + ", ".join(f"{s.label} ({s.runs} run{'s' if s.runs != 1 else ''})" for s in series))
    return 0


if __name__ == "__main__":
    sys.exit(main())
