"""The convergence study's report, from runs made up instead of trained: a
study takes hours, so a report that fails must fail here, not at a
study's end."""

import importlib.util
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load_study():
    spec = importlib.util.spec_from_file_location(
        "convergence_run", os.path.join(ROOT, "tools", "convergence", "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_quick_cser_study_writes_its_table(tmp_path, monkeypatch):
    study = load_study()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cserps-launch").write_text("")

    def run_job(bin_dir, run_dir, method, setting, lr, seed, epochs, warmup, extra=()):
        accuracy = 0.88 if method == "ssgd" else 0.865
        return {"train_loss": 0.5, "global": accuracy, "local": accuracy - 0.005,
                "compression": 250.0, "seconds": 12.0}

    monkeypatch.setattr(study, "run_job", run_job)
    monkeypatch.setattr(study, "ensure_matplotlib", lambda: None)
    monkeypatch.setattr(study, "plot", lambda *args: [])
    monkeypatch.setattr(sys, "argv", ["run.py", "--quick", "--bin-dir", str(bin_dir),
                                      "--runs", str(tmp_path / "runs"),
                                      "--out", str(tmp_path / "out")])
    study.main()
    text = (tmp_path / "out" / "convergence_quick.md").read_text()
    assert "| S-SGD (R_C = 1) | 88.00 | 88.00 | 88.00 |" in text
    assert "| cser | 86.50 | 86.50 | 86.50 |" in text
    assert "| cser | 256 | " in text
