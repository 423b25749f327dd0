"""A fleet process restarted under the same name appends to its log: only its current run's lines count
as its ready line (an earlier run's line must not)."""

from __future__ import annotations

from libs.fleet import Fleet


def test_this_run_log_leaves_out_the_earlier_run(tmp_path):
    (tmp_path / "sim-0.log").write_text("worker sim-0 ready (pool p)\n")
    fleet = Fleet(env_file=tmp_path / "stack.env", state=tmp_path)
    proc = fleet._spawn("this", {}, "sim-0")  # the Zen of Python: any module that prints and exits
    proc.wait(30)
    assert "worker sim-0 ready" in fleet.log_tail("sim-0", 100)
    assert "worker sim-0 ready" not in fleet.this_run_log("sim-0")
    assert "Beautiful is better than ugly" in fleet.this_run_log("sim-0")
