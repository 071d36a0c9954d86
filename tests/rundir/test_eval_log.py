"""alfish.rundir.eval_log: records appended one JSON line each, read back as the iterations recorded, a half-written
last line (a run killed while appending) and lines that are not records skipped."""
import json

from alfish.rundir import eval_log


def test_appended_records_are_one_json_line_each_and_their_iterations_are_recorded(tmp_path):
    assert eval_log.recorded_iterations(str(tmp_path)) == set()  # no log yet
    eval_log.append_record(str(tmp_path), {"iteration": 10, "average_return": 1.5})
    eval_log.append_record(str(tmp_path), {"iteration": 20, "average_return": 2.5, "asynchronous": True})
    lines = (tmp_path / "eval_log.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"iteration": 10, "average_return": 1.5},
                                                    {"iteration": 20, "average_return": 2.5, "asynchronous": True}]
    assert eval_log.recorded_iterations(str(tmp_path)) == {10, 20}


def test_a_half_written_last_line_and_lines_without_an_iteration_are_skipped(tmp_path):
    (tmp_path / "eval_log.jsonl").write_text('{"iteration": 3}\n[1, 2]\n{"return": 1}\n{"iteration": "x"}\n'
                                             '{"iteration": 6}\n{"itera')
    assert eval_log.recorded_iterations(str(tmp_path)) == {3, 6}
