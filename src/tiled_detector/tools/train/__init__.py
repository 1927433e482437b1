"""Training the bundled models (detector, rotated boxes, pose) on the synthetic worlds and exporting them."""
