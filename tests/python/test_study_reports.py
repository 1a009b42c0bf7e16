"""The convergence study's report writers, on made-up runs: a study takes
hours, so a writer that fails must fail here, not at a study's end."""

import importlib.util
import os
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load_study():
    spec = importlib.util.spec_from_file_location(
        "convergence_run", os.path.join(ROOT, "tools", "convergence", "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cser_study_writes_its_table(tmp_path, monkeypatch):
    study = load_study()
    monkeypatch.setattr(study, "plot", lambda *args: [])
    run = dict(train_loss=0.5, compression=250.0, seconds=12.0)
    reference = [dict(run, **{"global": 0.88, "local": 0.88})]
    results = {("cser", 256): ({"ratio_c1": 16, "ratio_c2": 512, "period": 32}, 0.05,
                               [dict(run, **{"global": 0.865, "local": 0.86})])}
    args = types.SimpleNamespace(out=str(tmp_path))
    study.write_cser_report(args, "quick", 1, [1], [0.05], reference, results, 60.0)
    text = (tmp_path / "convergence_quick.md").read_text()
    assert "| S-SGD (R_C = 1) | 88.00" in text
    assert "| cser | failed | 86.50" in text
    assert "| cser | 256 | " in text
