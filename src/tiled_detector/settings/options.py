"""String options chosen by name (backend, precision, merge method, ...): one Enum base for all of them."""

from __future__ import annotations

import enum
import re
from typing import TypeVar

_T = TypeVar("_T", bound="Option")


class Option(str, enum.Enum):
    """An Enum of strings with a case-insensitive `from_value` whose error states the valid values."""

    @classmethod
    def from_value(cls: type[_T], value: str | _T) -> _T:
        """The member named by `value` (a member, or its value in any case)."""
        if isinstance(value, cls):
            return value
        text = str(value.value if isinstance(value, enum.Enum) else value).strip().lower()
        for member in cls:
            if member.value == text:
                return member
        what = re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()
        valid = ", ".join(m.value for m in cls)
        raise ValueError(f"unknown {what} {value!r}; expected one of: {valid}")


class ChannelOrder(Option):
    """Channel order of the model's input (auto: the model file's, else its family's, else rgb)."""

    AUTO = "auto"
    RGB = "rgb"
    BGR = "bgr"


class LetterboxAnchor(Option):
    """Where a view resized into the model input sits (auto: the model family's, else center)."""

    AUTO = "auto"
    CENTER = "center"  # padding split on both sides (ultralytics)
    TOP_LEFT = "top_left"  # padding right and below only (YOLOX)
    STRETCH = "stretch"  # resized to the whole input, the aspect ratio not kept (PP-PicoDet): no padding


def check_channel_order(channel_order: str) -> str:
    """`channel_order` if it is a model input order ('rgb' or 'bgr'), else ValueError."""
    if channel_order not in (ChannelOrder.RGB, ChannelOrder.BGR):
        raise ValueError(
            f"channel_order must be 'rgb' or 'bgr' (the model's input order), got {channel_order!r}"
        )
    return str(ChannelOrder(channel_order).value)


def out_of_range(name: str, value: float, low: float | None, high: float | None) -> str | None:
    """Why `value` is outside [low, high] (either bound may be None), or None when it is inside."""
    if (low is not None and not value >= low) or (high is not None and not value <= high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        return f"{name} must be in {bounds}, got {value!r}"
    return None
