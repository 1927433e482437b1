"""Settings that name classes (`class_kinds`): names and ids as given, ids once the model's labels are known."""

from __future__ import annotations

import pytest

from tiled_detector.settings.class_kinds import Classes, ClassValues, class_id, class_key

LABELS = ("person", "bicycle", "car", "dog")


def test_a_class_is_an_id_or_a_name_and_resolves_against_the_labels() -> None:
    assert class_key(" 3 ", "classes") == 3 and class_key("car", "classes") == "car"
    assert class_id("car", LABELS, "classes") == 2 and class_id(3, LABELS, "classes") == 3
    assert class_id(7, None, "classes") == 7  # no labels loaded: an id is taken as it is
    with pytest.raises(ValueError, match=r"classes: unknown class id 4 \(the model has 4 classes, 0 to 3\)"):
        class_id(4, LABELS, "classes")
    with pytest.raises(ValueError, match="unknown class 'cat' \\(known: person, bicycle, car, dog\\)"):
        class_id("cat", LABELS, "classes")
    for bad in (-1, "", True, 1.5):
        with pytest.raises(ValueError, match="classes"):
            class_key(bad, "classes")


def test_classes_keep_ids_first_then_names_each_once_and_resolve_to_sorted_ids() -> None:
    kind = Classes()
    held = kind.check("classes", ["dog", "2", 0, "dog", 2])
    assert held == (0, 2, "dog")
    assert kind.check("classes", []) is None and kind.check("classes", None) is None
    assert kind.resolve("classes", held, LABELS) == (0, 2, 3)
    assert kind.encode("classes", held) == {"classes": ["0", "2", "dog"]}
    assert kind.check("classes", kind.decode("classes", {"classes": "dog, 1"})) == (1, "dog")


def test_class_values_keep_the_last_entry_per_class_in_range() -> None:
    kind = ClassValues()
    held = kind.check("class_thresholds", ["person:0.35", "3:0.6", "person:0.4"])
    assert held == (("person", 0.4), (3, 0.6))
    assert kind.resolve("class_thresholds", held, LABELS) == ((0, 0.4), (3, 0.6))
    # a name and its id: the later entry wins
    assert kind.resolve("class_thresholds", (("dog", 0.2), (3, 0.7)), LABELS) == ((3, 0.7),)
    assert kind.encode("class_thresholds", held) == {"class_thresholds": ["person:0.4", "3:0.6"]}
    with pytest.raises(ValueError, match=r"class_thresholds of person must be in \[0.0, 1.0\], got 1.5"):
        kind.check("class_thresholds", ["person:1.5"])
    with pytest.raises(ValueError, match="entries are 'class:value'"):
        kind.check("class_thresholds", ["person"])
