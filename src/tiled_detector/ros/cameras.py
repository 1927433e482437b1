"""The node's inputs: which topics each camera subscribes and publishes (no rclpy here: tested anywhere).

One camera (the `cameras` parameter empty): `image` in, `detections`, `debug_image` (and a segmentation model's
`masks`, a pose model's `keypoints`) out, names relative to the
node (remapped by the launch file). Several cameras: each camera topic T (e.g. `/front/image_raw`) is subscribed
(`T/compressed` with the compressed transport), and its results go to T's namespace: `/front/detections`,
`/front/debug_image`, `/front/masks`, `/front/keypoints`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CameraTopics:
    """One camera's topics: `name` (as configured, for /diagnostics), the image topic subscribed, and the
    detections, debug-image, masks (label image) and keypoints topics published."""

    name: str
    image: str
    detections: str
    debug_image: str
    masks: str = "masks"
    keypoints: str = "keypoints"


def camera_topics(cameras: Sequence[str], compressed: bool = False) -> list[CameraTopics]:
    """The topics of every camera (module docstring); a ValueError names a camera topic without a namespace
    of its own or two cameras whose results would share a topic."""
    if not cameras:
        image = "image/compressed" if compressed else "image"
        return [CameraTopics("image", image, "detections", "debug_image")]
    found: dict[str, str] = {}
    topics = []
    for given in cameras:
        topic = str(given).strip().rstrip("/")
        namespace = topic.rpartition("/")[0]
        if not namespace.strip("/"):
            raise ValueError(
                f"camera topic {given!r} needs a namespace of its own, where its detections are published "
                "(e.g. /front/image_raw -> /front/detections)"
            )
        if namespace in found:
            raise ValueError(
                f"cameras {found[namespace]!r} and {given!r} would both publish on {namespace}/detections: "
                "give each camera its own namespace"
            )
        found[namespace] = str(given)
        image = f"{topic}/compressed" if compressed else topic
        topics.append(
            CameraTopics(
                topic,
                image,
                f"{namespace}/detections",
                f"{namespace}/debug_image",
                f"{namespace}/masks",
                f"{namespace}/keypoints",
            )
        )
    return topics


def check_mask_cameras(entries: Sequence[tuple[str, object]], cameras: Sequence[str] | None) -> None:
    """Refuse `ignore_mask` entries for a camera the node does not have (ValueError naming it): "camera=path"
    entries name a topic of `cameras`; with one camera (`cameras` empty) the path is given alone."""
    named = [camera for camera, _ in entries if camera]
    known = [str(c).strip().rstrip("/") for c in cameras or ()]
    if named and not known:
        raise ValueError(
            f"ignore_mask: {named[0]}=... names a camera, but the node has one input: give the mask's path alone"
        )
    for camera in named:
        if camera not in known:
            raise ValueError(f"ignore_mask: no camera {camera!r} (cameras: {', '.join(known)})")
