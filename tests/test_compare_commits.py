"""benchmarks/compare_commits.py: both sides measured, cold or each warm from its own cache."""

import json
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import compare_commits  # noqa: E402


@pytest.fixture
def suite(tmp_path):
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "test_tiny.py").write_text("def test_one():\n    pass\n")
    return folder


def test_warm_sides_each_fill_a_cache_of_their_own_before_they_are_measured(suite, tmp_path,
                                                                            capsys):
    out = tmp_path / "out"
    compare_commits.main(["--base", "HEAD", "--cwd", str(suite), "--out", str(out), "--warm",
                          "--", "-p", "no:pallas", "-p", "no:xdist"])
    printed = capsys.readouterr().out
    assert "warm (each side's own cache, filled by a first run)" in printed
    for side in ("base", "tree"):
        assert (out / f"{side}-fill.xml").exists()
        assert (out / f"cache-{side}").is_dir()
        assert json.loads((out / f"{side}-0.json").read_text())["warm"] is True
    assert "verdicts that differ: 0" in printed


def test_a_cold_base_is_not_compared_with_a_warm_tree(suite, tmp_path):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "base-0.json").write_text(json.dumps({"cpu": 1.0, "wall": 1.0}))
    with pytest.raises(SystemExit, match="measured cold: run without --warm"):
        compare_commits.main(["--base", "HEAD", "--cwd", str(suite), "--out",
                              str(tmp_path / "out"), "--warm", "--base-from", str(earlier),
                              "--", "-p", "no:pallas", "-p", "no:xdist"])
