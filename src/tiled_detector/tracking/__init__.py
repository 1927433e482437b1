"""Tracking: persistent ids per camera over the merged detections (the host side, after the frame program)."""
