"""Settings of the benchmark panel that several tests start from."""

from __future__ import annotations


def one_quick_numpy_rung(panel, sizes: dict) -> None:
    """Sets the benchmark panel to time `naive` alone, once, on numpy, at `sizes`, no baselines."""
    panel.set_sizes(**sizes)
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(1)
    for name, check in panel.schedule_checks.items():
        check.setChecked(name == "naive")
    for check in panel.baseline_checks.values():
        check.setChecked(False)
