"""bench/tools/bench_diff.py: the before/after comparison of two bench JSON files."""

import importlib.util
import json
import os

from conftest import REPO


def load_tool():
    spec = importlib.util.spec_from_file_location("bench_diff", os.path.join(REPO, "bench", "tools", "bench_diff.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(commit, times, checked=True):
    return {
        "device": "nvidia-h200-x2",
        "ranks": 2,
        "commit": commit,
        "results": [
            {"mode": "ht", "op": op, "dtype": "bf16", "time_us": t, "checked": checked} for op, t in times.items()
        ],
    }


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(json.dumps(content))
    return str(path)


def test_marks_faster_and_slower_beyond_the_threshold(tmp_path):
    tool = load_tool()
    before = write(tmp_path, "a.json", run("aaa", {"dispatch": 200.0, "combine": 100.0, "layout": 18.0}))
    after = write(tmp_path, "b.json", run("bbb", {"dispatch": 180.0, "combine": 103.0, "layout": 18.1}))
    lines, regressed = tool.compare(tool.load(before), tool.load(after), 2.0)
    text = "\n".join(lines)
    assert "aaa -> bbb" in text
    dispatch = next(line for line in lines if line.startswith("ht dispatch bf16"))
    assert "-20.0" in dispatch and "-10.0%" in dispatch and dispatch.endswith("faster")
    combine = next(line for line in lines if line.startswith("ht combine bf16"))
    assert combine.endswith("SLOWER")
    layout = next(line for line in lines if line.startswith("ht layout bf16"))
    assert not layout.endswith(("faster", "SLOWER"))
    assert regressed
    assert tool.main([before, after]) == 1
    assert tool.main([before, after, "--threshold", "5"]) == 0


def test_a_lost_check_is_a_regression_and_missing_ops_are_named(tmp_path):
    tool = load_tool()
    before = write(tmp_path, "a.json", run("aaa", {"dispatch": 200.0, "combine": 100.0}))
    after_content = run("bbb", {"dispatch": 200.0}, checked=False)
    after_content["device"] = "nvidia-h200-x4"
    after = write(tmp_path, "b.json", after_content)
    lines, regressed = tool.compare(tool.load(before), tool.load(after), 2.0)
    text = "\n".join(lines)
    assert regressed
    assert "NOT CHECKED" in text
    assert "(not in AFTER)" in text
    assert "note: device differs" in text
