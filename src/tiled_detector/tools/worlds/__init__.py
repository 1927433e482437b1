"""Synthetic worlds with known truth: the scenes of boxes, rotated boxes, depth and people's poses."""
