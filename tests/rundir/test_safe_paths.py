"""alfish.rundir.safe_paths: below the root_dir no symlink is followed (in the middle of a path or at its end), only
regular files are opened (a FIFO neither blocks nor is read), a hard-linked file is not written, '..' does not leave
the root, and deletion and renames never reach through a link. Each refusal is one UnsafePathError line naming the
path; nothing outside the root changes."""
from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from alfish.rundir import safe_paths
from alfish.rundir.atomic_text import write_text_atomic
from alfish.rundir.safe_paths import UnsafePathError


def tree_digest(folder) -> dict[str, str]:
    """Every entry under ``folder``: relative path -> sha256 of a file, 'dir', or 'link -> target'."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[rel] = f"link -> {os.readlink(path)}"
            elif os.path.isdir(path):
                found[rel] = "dir"
            else:
                with open(path, "rb") as f:
                    found[rel] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture
def planted(tmp_path):
    """A root_dir and an outside folder with one file; returns (root, outside, digest of outside)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("outside, not alfish's\n")
    return root, outside, tree_digest(outside)


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


def test_a_link_in_the_middle_of_a_path_is_refused(planted):
    root, outside, before = planted
    (root / "checkpoints").symlink_to(outside)
    for call in (lambda: safe_paths.open_in_root(str(root), "checkpoints/new.txt", "w", create_dirs=True),
                 lambda: safe_paths.open_in_root(str(root), "checkpoints/secret.txt", "rb"),
                 lambda: safe_paths.make_dirs_in_root(str(root), "checkpoints/ckpt-1"),
                 lambda: safe_paths.remove_tree_in_root(str(root), "checkpoints/secret.txt"),
                 lambda: safe_paths.remove_listed(str(root), "checkpoints", ["secret.txt"]),
                 lambda: safe_paths.list_dir_in_root(str(root), "checkpoints")):
        with pytest.raises(UnsafePathError) as caught:
            call()
        assert one_line(caught.value) == (f"{root}/checkpoints is a symlink; alfish never follows links inside a "
                                          "results directory: replace it with a real directory or use another "
                                          "--root_dir")
    assert tree_digest(outside) == before


@pytest.mark.parametrize("mode", ["rb", "a", "w", "x"])
def test_a_link_at_the_end_of_a_path_is_refused(planted, mode):
    root, outside, before = planted
    (root / "log.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafePathError) as caught:
        safe_paths.open_in_root(str(root), "log.txt", mode)
    assert one_line(caught.value).startswith(f"{root}/log.txt is a symlink; ")
    assert "replace it with a real file" in str(caught.value)
    assert tree_digest(outside) == before


def test_a_dangling_link_is_not_created_through(planted):
    root, outside, before = planted
    (root / "eval_log.jsonl").symlink_to(outside / "created-by-alfish.jsonl")
    with pytest.raises(UnsafePathError):
        safe_paths.open_in_root(str(root), "eval_log.jsonl", "a")
    assert tree_digest(outside) == before


def test_reading_a_fifo_does_not_block_and_is_refused(planted):
    root, _, _ = planted
    os.mkfifo(root / "eval_log.jsonl")
    outcome = []

    def read() -> None:
        try:
            safe_paths.read_bytes_in_root(str(root), "eval_log.jsonl", 1024)
        except UnsafePathError as e:
            outcome.append(str(e))

    start = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)  # (a blocked open would leave the test, not hang it)
    reader.start()
    reader.join(timeout=1.0)
    assert not reader.is_alive() and time.monotonic() - start < 1.0
    assert outcome == [f"{root}/eval_log.jsonl is a FIFO, not a file; alfish opens only regular files and "
                       "directories inside a results directory: remove it or use another --root_dir"]
    with pytest.raises(UnsafePathError, match="is a FIFO"):  # writing (no reader) is refused as well, at once
        safe_paths.open_in_root(str(root), "eval_log.jsonl", "a")


def test_a_hard_linked_file_is_read_but_not_appended_to(planted):
    root, outside, before = planted
    os.link(outside / "secret.txt", root / "log.txt")
    assert safe_paths.read_bytes_in_root(str(root), "log.txt", 100) == b"outside, not alfish's\n"
    for mode in ("a", "w"):
        with pytest.raises(UnsafePathError) as caught:
            safe_paths.open_in_root(str(root), "log.txt", mode)
        assert one_line(caught.value).startswith(f"{root}/log.txt is a hard link (2 names)")
    assert tree_digest(outside) == before


@pytest.mark.parametrize("path", ["../outside/secret.txt", "a/../../outside/secret.txt", "{outside}/secret.txt"])
def test_a_path_that_leaves_the_root_is_refused(planted, path):
    root, outside, before = planted
    path = path.format(outside=outside)
    with pytest.raises(UnsafePathError) as caught:
        safe_paths.open_in_root(str(root), path, "a")
    assert one_line(caught.value) == (f"{outside}/secret.txt is outside the results directory {root}; alfish reads "
                                      "and writes only inside it")
    with pytest.raises(UnsafePathError):
        safe_paths.remove_tree_in_root(str(root), path)
    assert tree_digest(outside) == before


def test_the_root_dir_itself_may_be_a_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "typed").symlink_to(real)
    with safe_paths.open_in_root(str(tmp_path / "typed"), "log.txt", "a") as f:
        f.write("line\n")
    assert (real / "log.txt").read_text() == "line\n"


def test_deleting_and_renaming_move_or_remove_the_link_never_its_target(planted):
    root, outside, before = planted
    (root / "tb").symlink_to(outside)
    safe_paths.rename_in_root(str(root), "tb", "aside/tb")
    assert os.readlink(root / "aside" / "tb") == str(outside)
    safe_paths.remove_tree_in_root(str(root), "aside/tb")
    assert not os.path.lexists(root / "aside" / "tb")
    assert tree_digest(outside) == before


def test_remove_listed_deletes_only_the_named_regular_files(planted):
    root, outside, before = planted
    ckpt = root / "ckpt-1"
    ckpt.mkdir()
    for name in ("a.pt", "manifest.json", "planted.txt"):
        (ckpt / name).write_text(name)
    (ckpt / "link.pt").symlink_to(outside / "secret.txt")
    left = safe_paths.remove_listed(str(root), "ckpt-1", ["a.pt", "manifest.json", "link.pt", "../outside"])
    assert left == ["link.pt", "planted.txt"] and sorted(os.listdir(ckpt)) == left
    assert tree_digest(outside) == before


def test_require_kind_and_unsafe_path_in(planted):
    root, outside, _ = planted
    (root / "videos").symlink_to(outside)
    (root / "config").mkdir()
    assert safe_paths.require_kind_in_root(str(root), "config", "dir") == "dir"
    assert safe_paths.require_kind_in_root(str(root), "config/full.gin", "file") == "missing"
    with pytest.raises(UnsafePathError, match="videos is a symlink") as caught:
        safe_paths.require_kind_in_root(str(root), "videos", "dir")
    with pytest.raises(UnsafePathError, match="config is a directory, not a file"):
        safe_paths.require_kind_in_root(str(root), "config", "file")
    try:
        raise RuntimeError("a library's wrapper") from caught.value
    except RuntimeError as wrapped:
        assert safe_paths.unsafe_path_in(wrapped) is caught.value
    assert safe_paths.unsafe_path_in(RuntimeError("no refusal")) is None


def test_atomic_text_replaces_a_file_and_refuses_a_link(planted):
    root, outside, before = planted
    write_text_atomic(str(root), "config/operative.gin", "first\n")
    write_text_atomic(str(root), "config/operative.gin", "second\n")
    assert (root / "config" / "operative.gin").read_text() == "second\n"
    assert os.listdir(root / "config") == ["operative.gin"]  # no temporary file left
    (root / "config" / "full.gin").symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafePathError, match="full.gin is a symlink"):
        write_text_atomic(str(root), "config/full.gin", "through the link?\n")
    assert tree_digest(outside) == before and sorted(os.listdir(root / "config")) == ["full.gin", "operative.gin"]
