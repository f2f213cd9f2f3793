"""The sources a snapshot keeps and the diff a restore with reload makes."""

from __future__ import annotations

import hashlib
import os
import stat

from prism_debug.reload import sources


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_keep_copies_only_files_still_as_imported_and_lists_every_one(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    same, edited, twin = job / "same.py", job / "edited.py", job / "twin.py"
    same.write_text("A = 1\n")
    edited.write_text("B = 2\n")
    twin.write_text("A = 1\n")  # one copy serves both
    folder = tmp_path / "snap"
    folder.mkdir()
    seen = {str(same): sha("A = 1\n"), str(twin): sha("A = 1\n"),
            str(edited): sha("B = 1\n"),  # edited since import
            "relative.py": sha("x"), str(job / "bad.py"): "not-a-digest"}
    recorded = sources.keep(folder, seen)
    assert recorded == {str(same): sha("A = 1\n"), str(twin): sha("A = 1\n"),
                        str(edited): sha("B = 1\n")}
    assert sorted(p.name for p in folder.iterdir()) == [sources.kept_name(sha("A = 1\n"))]
    kept = folder / sources.kept_name(sha("A = 1\n"))
    assert kept.read_text() == "A = 1\n"
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600


def test_changes_pairs_the_kept_text_with_the_file_now(tmp_path):
    folder = tmp_path / "snap"
    folder.mkdir()
    script, gone, unkept = tmp_path / "s.py", tmp_path / "gone.py", tmp_path / "u.py"
    for path, text in ((script, "def f():\n    return 1\n"), (gone, "G = 1\n")):
        path.write_text(text)
    recorded = sources.keep(folder, {str(script): sha(script.read_text()),
                                     str(gone): sha("G = 1\n")})
    recorded[str(unkept)] = sha("old\n")
    unkept.write_text("new\n")
    assert sources.changes(folder, recorded) == {str(unkept): (None, "new\n")}
    script.write_text("def f():\n    return 2\n")
    gone.unlink()
    assert sources.changes(folder, recorded) == {
        str(script): ("def f():\n    return 1\n", "def f():\n    return 2\n"),
        str(gone): ("G = 1\n", None), str(unkept): (None, "new\n")}
    # a kept copy that no longer has its hash is no copy
    (folder / sources.kept_name(sha("G = 1\n"))).write_text("tampered\n")
    assert sources.changes(folder, recorded)[str(gone)] == (None, None)


def test_stage_writes_private_texts_the_rank_can_check(tmp_path):
    entries = [{"path": "/a.py", "source": "def f():\n    return 2\n", "changed": ["f"],
                "patch": ["f"], "add": []}]
    (staged,) = sources.stage(entries, tmp_path)
    assert staged == {"path": "/a.py", "changed": ["f"], "patch": ["f"], "add": [],
                      "text": str(tmp_path / "reload-0.py"),
                      "sha256": sha("def f():\n    return 2\n")}
    assert stat.S_IMODE(os.stat(tmp_path / "reload-0.py").st_mode) == 0o600
    assert sources.read_text(staged["text"]) == ("def f():\n    return 2\n", staged["sha256"])
