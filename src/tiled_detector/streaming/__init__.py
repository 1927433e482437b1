"""A camera's frames beyond one call: a frame run in parts reported as one frame, depth images paired with colour frames."""
