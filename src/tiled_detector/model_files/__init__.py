"""What a model file is read as (layout, family, labels, input conventions, keypoints) and the engine a config asks for."""
