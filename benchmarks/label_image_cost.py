"""What composing a frame's label image on the host costs (`InstanceMasks.labels`: each detection's mask written
into its box by one boolean-index assignment, the worst-ranked first; `numpy.copyto(..., where=)` instead) against
vectorised alternatives that sort every mask pixel
by its detection's rank (`numpy.lexsort` + `unique`, the composition `InstanceMasks.select` used before; and
`numpy.minimum.at`), all checked equal, on random elliptic masks of random boxes piled on each other.

    .venv/bin/python benchmarks/label_image_cost.py --size 3840x2160 --objects 65 --box 30 400

Prints each method's median and fastest milliseconds over `--runs`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tiled_detector.types import InstanceMasks


def _scene(
    rng: np.random.Generator, height: int, width: int, count: int, low: int, high: int
) -> InstanceMasks:
    boxes, bits = [], []
    for _ in range(count):
        wide, tall = (int(v) for v in rng.integers(low, high, 2))
        x0, y0 = int(rng.integers(0, width - wide)), int(rng.integers(0, height - tall))
        boxes.append((x0, y0, x0 + wide, y0 + tall))
        yy, xx = np.mgrid[:tall, :wide]
        bits.append(
            (((yy - tall / 2) / (tall / 2)) ** 2 + ((xx - wide / 2) / (wide / 2)) ** 2 < 1).reshape(-1)
        )
    return InstanceMasks((height, width), np.array(boxes), np.concatenate(bits), 1.0, (height, width))


def _pixels(masks: InstanceMasks) -> tuple[np.ndarray, np.ndarray]:
    """Every mask pixel: its flat index in the label image and its detection."""
    areas = masks.areas
    row = np.repeat(np.arange(len(masks)), areas)
    local = np.arange(int(areas.sum())) - np.repeat(np.cumsum(areas) - areas, areas)
    wide = np.maximum(masks.boxes[row, 2] - masks.boxes[row, 0], 1)
    x, y = masks.boxes[row, 0] + local % wide, masks.boxes[row, 1] + local // wide
    on = masks.bits
    return (y[on] * masks.shape[1] + x[on]).astype(np.int64), row[on]


def by_lexsort(masks: InstanceMasks) -> np.ndarray:
    flat, row = _pixels(masks)
    order = np.lexsort((masks.rank[row], flat))
    first = np.unique(flat[order], return_index=True)[1]
    labels = np.zeros(masks.shape, np.uint16)
    labels.reshape(-1)[flat[order][first]] = row[order][first] + 1
    return labels


def by_minimum_at(masks: InstanceMasks) -> np.ndarray:
    flat, row = _pixels(masks)
    order = np.argsort(masks.rank, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    best = np.full(masks.shape[0] * masks.shape[1], len(order), np.int64)
    np.minimum.at(best, flat, position[row])
    return np.concatenate([order + 1, [0]]).astype(np.uint16)[best].reshape(masks.shape)


def by_copyto(masks: InstanceMasks) -> np.ndarray:
    labels = np.zeros(masks.shape, np.uint16)
    areas = masks.areas
    starts = np.cumsum(areas) - areas
    for k in np.argsort(masks.rank, kind="stable")[::-1]:
        x0, y0, x1, y1 = masks.boxes[k]
        crop = masks.bits[starts[k] : starts[k] + areas[k]].reshape(y1 - y0, x1 - x0)
        np.copyto(labels[y0:y1, x0:x1], np.uint16(k + 1), where=crop)
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="3840x2160")
    parser.add_argument("--objects", type=int, default=65)
    parser.add_argument(
        "--box", type=int, nargs=2, default=(30, 400), help="box sides drawn from [low, high)"
    )
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    rng = np.random.default_rng(0)
    masks = _scene(rng, height, width, args.objects, *args.box)
    masks = masks.select(rng.permutation(len(masks)))  # ranks unlike the order (as after the tracker)
    want = by_lexsort(masks)
    print(
        f"{args.size}, {len(masks)} objects, {int(masks.bits.sum())} mask pixels in {masks.bits.size} box pixels"
    )

    def composed(m: InstanceMasks) -> np.ndarray:
        return InstanceMasks(m.shape, m.boxes, m.bits, m.scale, m.frame_hw, m.rank).labels  # a fresh cache

    for name, method in (
        ("InstanceMasks.labels (boolean index per box)", composed),
        ("numpy.copyto(where=) per box", by_copyto),
        ("lexsort + unique (vectorised)", by_lexsort),
        ("minimum.at (vectorised)", by_minimum_at),
    ):
        np.testing.assert_array_equal(method(masks), want)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            method(masks)
            times.append((time.perf_counter() - start) * 1e3)
        print(f"  {name:46s} median {np.median(times):8.2f} ms, fastest {min(times):8.2f} ms")


if __name__ == "__main__":
    main()
