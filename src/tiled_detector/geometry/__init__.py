"""Geometry of boxes and masks in any array library (numpy or torch): convex polygons and rotated rectangles, the label image of instance masks."""
