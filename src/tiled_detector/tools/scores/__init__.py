"""Truth and evaluations: COCO, rotated, keypoint and stream truth, and what eval reports from them."""
