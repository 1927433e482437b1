"""The frame path: a frame's pixels to merged boxes, on the engine's device (tile planning, upload, preprocessing,
decoding, the seam rule, merging, post-processing, and the frame program that runs them as one capture)."""
