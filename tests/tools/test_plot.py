"""``python -m alfish.tools.plot``: figures of real runs at the asked pixel size, and a known synthetic curve whose band
is checked pixel by pixel in the PNG written (min-max and std bands at two x columns)."""
import sys

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from alfish.tools import plot
from tests.tools.synthetic import LINEAR, OFFSETS, seeds

pytestmark = [pytest.mark.timeout(60)]


def test_real_runs_make_a_png_of_size_times_dpi(real_runs, tmp_path, capsys):
    out = tmp_path / "curves.png"
    runs = ",".join(str(r) for r in real_runs)
    assert plot.main([f"--run=sac={runs}", str(real_runs[0]), "--size", "5", "3", "--dpi", "80", "-o", str(out)]) == 0
    image = imread(out)
    assert image.shape[:2] == (240, 400)  # H * dpi rows, W * dpi columns
    assert image[..., :3].std() > 0.05  # not a blank canvas
    assert f"(400x240 px): sac (2 runs), {real_runs[0]} (1 run)" in capsys.readouterr().out


@pytest.mark.parametrize("extra", [["--iqm", "--reps", "200"], ["--tag", "eval/average_return", "--x", "iteration"],
                                   ["--tag", "loss/critic_loss", "--x", "wall_clock", "--band", "std"]])
def test_real_runs_with_iqm_tensorboard_tags_and_other_x_axes(real_runs, tmp_path, extra):
    out = tmp_path / "curves.png"
    assert plot.main([f"--run=sac={real_runs[0]},{real_runs[1]}", "--dpi", "50", "-o", str(out)] + extra) == 0
    assert imread(out).shape[:2] == (200, 320)


def test_svg(real_runs, tmp_path):
    out = tmp_path / "curves.svg"
    assert plot.main([str(real_runs[0]), "-o", str(out)]) == 0
    assert "<svg" in out.read_text()[:1000]


def band_rows(image: np.ndarray, column: int) -> tuple[int, int]:
    """The first and last rows of ``column`` that are colored: the band (the line's color at plot.BAND_ALPHA over
    white, also where a grey grid line crosses it) and the mean line, but not the white background or grey grid."""
    pixels = image[:, column, :3]
    colored = pixels.max(axis=1) - pixels.min(axis=1) > 0.04  # (white and greys have equal channels)
    rows = np.flatnonzero(colored)
    assert len(rows) > 0, "no band in this column"
    return int(rows[0]), int(rows[-1])


@pytest.mark.parametrize("band", ["minmax", "std"])
def test_the_band_of_a_known_curve_is_where_it_must_be(tmp_path, band):
    # Three seeds whose returns are k, k + 2 and k + 4 at env steps 1000 k: the mean is k + 2; the min-max band spans
    # k to k + 4, the std band k + 2 ± sqrt(8/3).
    dirs = seeds(tmp_path, LINEAR)
    out = tmp_path / "known.png"
    args = plot.parse_args([f"--run=known={','.join(map(str, dirs))}", "--band", band, "--xlim", "0", "10000",
                            "--ylim", "-5", "25", "--size", "6", "4", "--dpi", "100", "-o", str(out)])
    fig = plot.draw([plot.series_of(g, args) for g in plot.groups_from_args(args.run, args.dirs)], args)
    plot.save(fig, str(out))
    image = imread(out)
    assert image.shape[:2] == (400, 600)
    ax = fig.axes[0]
    color = np.array(to_rgb(ax.lines[0].get_color()))
    assert color.max() - color.min() > 0.3  # a colored line (so its band is found by its color)
    spread = np.std(OFFSETS)
    for steps in (4500, 6500):  # between the ticks, so no vertical grid line lies on the column
        k = steps / 1000
        low, high = (k, k + 4) if band == "minmax" else (k + 2 - spread, k + 2 + spread)
        (column, bottom), (_, top) = ax.transData.transform([(steps, low), (steps, high)])
        found_top, found_bottom = band_rows(image, int(round(column)))
        # display y grows upwards, image rows downwards
        assert abs(found_top - (image.shape[0] - top)) <= 2, (steps, found_top, image.shape[0] - top)
        assert abs(found_bottom - (image.shape[0] - bottom)) <= 2, (steps, found_bottom, image.shape[0] - bottom)


def test_iqm_series_of_a_known_curve(tmp_path):
    # IQM of 3 seeds cuts nothing (3 // 4 = 0): the mean, k + 2; its CI lies within the seeds' range.
    dirs = seeds(tmp_path, LINEAR)
    args = plot.parse_args([f"--run=known={','.join(map(str, dirs))}", "--iqm", "--reps", "500", "-o", "x.png"])
    [series] = [plot.series_of(g, args) for g in plot.groups_from_args(args.run, args.dirs)]
    np.testing.assert_allclose(series.center, np.array(LINEAR) + 2)
    assert np.all(series.low >= np.array(LINEAR) - 1e-9) and np.all(series.high <= np.array(LINEAR) + 4 + 1e-9)
    assert np.all(series.low <= series.center) and np.all(series.center <= series.high)


@pytest.mark.parametrize("argv, message", [
    (["{run}", "-o", "{tmp}/x.jpg"], "--output '.*x.jpg' must end with .png or .svg"),
    (["{run}", "-o", "{tmp}/x.png", "--size", "0", "3"], "must be > 0"),
    (["{tmp}/missing", "-o", "{tmp}/x.png"], "missing is not a directory"),
    (["{run}", "-o", "{tmp}/no/such/dir/x.png"], "cannot write .*x.png"),
])
def test_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    [run, *_] = seeds(tmp_path)
    assert plot.main([a.format(run=run, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert __import__("re").search(message, err), err


def test_without_matplotlib_the_error_names_the_extra(tmp_path, monkeypatch, capsys):
    [run, *_] = seeds(tmp_path)
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # what an environment without matplotlib imports
    assert plot.main([str(run), "-o", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err == ("error: plot needs matplotlib, which is not installed: "
                                       "pip install 'alfish[plot]'\n")
    assert not (tmp_path / "x.png").exists()
