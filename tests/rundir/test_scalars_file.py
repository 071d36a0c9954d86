"""The scalars CSV (alfish.rundir.scalars_file): its bytes, appending on resume, disk errors as one line."""
import os

import pytest

from alfish.rundir.disk import DiskWriteError
from alfish.rundir.scalars_file import ScalarsFile


def test_header_rows_and_quoting(tmp_path):
    path = str(tmp_path / "scalars.csv")
    f = ScalarsFile(path)
    f.write_row(3, "loss/total", 0.1, wall_time=12.34567)
    f.write_row(4, 'train/a,b', 2.0, wall_time=1.0)
    f.close()
    f.close()  # a second close does nothing
    assert open(path).read() == ('step,tag,value,wall_time\n'
                                 '3,loss/total,0.1,12.346\n'
                                 '4,"train/a,b",2.0,1.000\n')


def test_a_resumed_run_appends_without_a_second_header(tmp_path):
    path = str(tmp_path / "scalars.csv")
    first = ScalarsFile(path)
    first.write_row(1, "a", 1.0, wall_time=0.0)
    first.close()
    second = ScalarsFile(path)
    second.write_row(2, "a", 2.0, wall_time=0.0)
    second.flush()
    assert open(path).read().splitlines() == ["step,tag,value,wall_time", "1,a,1.0,0.000", "2,a,2.0,0.000"]
    second.close()


def test_an_empty_file_gets_the_header(tmp_path):
    path = tmp_path / "scalars.csv"
    path.write_text("")
    ScalarsFile(str(path)).close()
    assert path.read_text() == "step,tag,value,wall_time\n"


def test_an_unwritable_path_is_one_disk_error_line(tmp_path):
    path = os.path.join(str(tmp_path), "missing", "scalars.csv")
    with pytest.raises(DiskWriteError, match=r"^cannot write the scalars CSV .*scalars\.csv: ") as info:
        ScalarsFile(path)
    assert "\n" not in str(info.value)
