"""alfish.tools.runs: groups from the command line, eval_log.jsonl as the trainer writes it (a resumed run, a line cut
short by a kill, a damaged line), and TensorBoard scalars of real runs against env steps, iterations and wall-clock."""
import numpy as np
import pytest

from alfish.tools.cli import ToolError
from alfish.tools.runs import eval_curve, groups_from_args, parse_group, read_curve, read_eval_log, tb_curve
from tests.integration.inprocess import eval_log
from tests.tools.synthetic import seeds, write_eval_log


def record(iteration, value):
    return dict(iteration=iteration, env_steps=10 * iteration, elapsed_s=iteration / 100, average_return=value)


def test_groups_from_labels_globs_and_plain_dirs(tmp_path):
    a, b, c = seeds(tmp_path)
    (tmp_path / "notes.txt").write_text("not a run")
    group = parse_group(f"sac={tmp_path}/seed-*")
    assert (group.label, group.dirs) == ("sac", (str(a), str(b), str(c)))
    [first, second] = groups_from_args([f"two={a},{b},{a}"], [str(c) + "/"])
    assert first.dirs == (str(a), str(b))  # each once
    assert (second.label, second.dirs) == (str(c), (str(c) + "/",))


@pytest.mark.parametrize("specs, paths, message", [
    (["sac"], [], "must be LABEL=DIR"),
    (["sac="], [], "must be LABEL=DIR"),
    (["sac={tmp}/nothing-*"], [], "matches no directory"),
    (["sac={tmp}/seed-0,,{tmp}/seed-1"], [], "empty directory name"),
    ([], ["{tmp}/missing"], "is not a directory"),
    (["x={tmp}/seed-0", "x={tmp}/seed-1"], [], "names two groups"),
    ([], [], "name at least one results directory"),
])
def test_bad_groups_are_one_line_errors(tmp_path, specs, paths, message):
    seeds(tmp_path)
    with pytest.raises(ToolError, match=message) as err:
        groups_from_args([s.format(tmp=tmp_path) for s in specs], [p.format(tmp=tmp_path) for p in paths])
    assert "\n" not in str(err.value)


def test_a_resumed_run_keeps_its_newest_history(tmp_path):
    # A run resumed from its checkpoint at iteration 100 evaluates iterations 200 and 300 again.
    root = write_eval_log(tmp_path / "run", [record(100, 1.0), record(200, 2.0), record(300, 3.0),
                                             record(200, 20.0), record(300, 30.0), record(400, 40.0)])
    for x, scale in (("iteration", 1), ("env_steps", 10), ("wall_clock", 0.01)):
        curve = eval_curve(str(root), x)
        np.testing.assert_allclose(curve.x, np.array([100, 200, 300, 400]) * scale)
        np.testing.assert_array_equal(curve.y, [1.0, 20.0, 30.0, 40.0])


def test_a_last_line_cut_short_is_left_out_and_a_bad_line_is_an_error(tmp_path):
    root = tmp_path / "run"
    write_eval_log(root, [record(100, 1.0)])
    with open(root / "eval_log.jsonl", "a") as f:
        f.write('{"iteration": 200, "env_st')  # killed while writing
    assert [r["iteration"] for r in read_eval_log(str(root))] == [100]
    (root / "eval_log.jsonl").write_text('{"iteration": 1}\n[1, 2]\n{}\n')
    with pytest.raises(ToolError, match=r"eval_log.jsonl:2: not a JSON object"):
        read_eval_log(str(root))
    (root / "eval_log.jsonl").write_text('{"iteration": 1}\nnot json\n')
    with pytest.raises(ToolError, match=r"eval_log.jsonl:2: not a JSON line"):
        read_eval_log(str(root))


def test_a_missing_field_names_the_fields_there_are(tmp_path):
    root = write_eval_log(tmp_path / "run", [record(100, 1.0)])
    with pytest.raises(ToolError, match=r"record 1 has no number 'return_std' \(it has average_return, elapsed_s, "
                                        r"env_steps, iteration\)"):
        eval_curve(str(root), "env_steps", "return_std")
    with pytest.raises(ToolError, match="has no eval_log.jsonl"):
        eval_curve(str(tmp_path), "env_steps")


def test_tensorboard_eval_return_matches_the_eval_log(real_runs):
    for root in real_runs:
        log = eval_log(root)
        assert len(log) >= 4
        # eval/ is written at the iteration; its env steps come through train/env_steps
        for x, field in (("iteration", "iteration"), ("env_steps", "env_steps")):
            curve = tb_curve(str(root), "eval/average_return", x)
            np.testing.assert_allclose(curve.x, [r[field] for r in log])
            np.testing.assert_allclose(curve.y, [r["average_return"] for r in log], rtol=1e-6)  # float32
        vs_env_steps = tb_curve(str(root), "eval_vs_env_steps/average_return", "env_steps")
        np.testing.assert_allclose(vs_env_steps.x, [r["env_steps"] for r in log])
        clock = read_curve(str(root), "wall_clock", tag="eval/average_return")
        assert clock.x[0] >= 0 and np.all(np.diff(clock.x) > 0)


def test_tensorboard_errors_are_one_line(real_runs, tmp_path):
    root = str(real_runs[0])
    with pytest.raises(ToolError, match=r"has no scalar 'eval/nope'; it has \d+: eval/average_episode_length"):
        tb_curve(root, "eval/nope", "iteration")
    with pytest.raises(ToolError, match="is recorded against env steps; plot it with --x env_steps"):
        tb_curve(root, "eval_vs_env_steps/average_return", "iteration")
    with pytest.raises(ToolError, match="has no tb/ folder"):
        tb_curve(str(tmp_path), "eval/average_return", "iteration")
