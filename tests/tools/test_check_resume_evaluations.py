"""check_resume's comparison of two runs' evaluations: an evaluation sent just before the stop is recorded by one run
and kept pending by the other depending on the evaluator's speed, which is no difference; everything else is."""
from alfish.tools.check_resume import compare_evaluations


def rec(iteration: int, average_return: float) -> dict:
    return {"iteration": iteration, "env_steps": 10 * iteration, "average_return": average_return}


def pend(iteration: int, state: float) -> dict:
    return {"iteration": iteration, "env_steps": 10 * iteration, "index": iteration // 5, "state": {"w": state}}


def test_recorded_in_one_run_and_pending_in_the_other_is_no_difference():
    assert compare_evaluations([rec(5, 1.0), rec(10, 2.0)], [], [rec(5, 1.0)], [pend(10, 0.5)]) is None
    assert compare_evaluations([rec(5, 1.0)], [pend(10, 0.5)], [rec(5, 1.0), rec(10, 2.0)], []) is None


def test_evaluations_both_runs_recorded_or_kept_must_be_equal():
    assert compare_evaluations([rec(5, 1.0)], [], [rec(5, 1.5)], []) == (
        "eval_log.jsonl/iteration 5/0/average_return: 1.0 vs 1.5")
    assert compare_evaluations([rec(5, 1.0)], [pend(10, 0.5)], [rec(5, 1.0)], [pend(10, 0.25)]) == (
        "pending_evaluations/iteration 10/0/state/w: 0.5 vs 0.25")
    assert compare_evaluations([rec(5, 1.0)], [pend(10, 0.5)], [rec(5, 1.0)], [pend(10, 0.5)]) is None


def test_an_evaluation_one_run_has_neither_recorded_nor_kept_is_a_difference():
    assert compare_evaluations([rec(5, 1.0), rec(10, 2.0)], [], [rec(5, 1.0)], []) == (
        "the evaluation of iteration 10: only the first run recorded or kept it")
    assert compare_evaluations([], [], [], [pend(5, 0.5)]) == (
        "the evaluation of iteration 5: only the second run recorded or kept it")
