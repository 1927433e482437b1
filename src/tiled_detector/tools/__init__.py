"""Offline tools around the detector: evaluation, INT8 calibration, the benchmark, scoring against ground truth,
synthetic scenes and drawing."""
