"""Inference engines behind one interface (see `base.Engine`)."""

from tiled_detector.engines.base import Backend, Engine, Precision, TensorSpec, load_engine

__all__ = ["Backend", "Engine", "Precision", "TensorSpec", "load_engine"]
