"""Engine cache: keys, staleness, atomic writes, the cross-process lock, rebuild of broken engines."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tiled_detector.engines import cache as cache_mod
from tiled_detector.engines.cache import EngineCache, EngineKey, atomic_write, default_cache_dir, sha256_file

PROFILE = ((1, 3, 640, 640), (9, 3, 640, 640), (32, 3, 640, 640))


def key(**changes: object) -> EngineKey:
    fields = dict(
        model_name="yolo",
        onnx_sha256="ab" * 32,
        precision="fp16",
        profile=PROFILE,
        trt_version="10.3.0",
        gpu_name="Orin",
        compute_capability=(8, 7),
    )
    fields.update(changes)
    return EngineKey(**fields)


def test_key_is_stable_and_every_field_changes_the_file() -> None:
    assert key().file_name == key().file_name
    assert key().file_name.startswith("yolo-fp16-") and key().file_name.endswith(".engine")
    variants = [
        key(onnx_sha256="cd" * 32),
        key(precision="int8"),
        key(profile=((1, 3, 640, 640), (8, 3, 640, 640), (32, 3, 640, 640))),
        key(trt_version="10.7.0"),
        key(gpu_name="H200"),
        key(compute_capability=(9, 0)),
        key(extra=(("calib", "/data"),)),
    ]
    names = {v.file_name for v in variants} | {key().file_name}
    assert len(names) == len(variants) + 1
    assert key(model_name="renamed").digest == key().digest


def test_key_rejects_bad_profiles() -> None:
    with pytest.raises(ValueError, match="min <= opt <= max"):
        key(profile=((9, 3, 640, 640), (1, 3, 640, 640), (32, 3, 640, 640)))


def test_sha256_file(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    assert sha256_file(tmp_path / "a") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "tiled_detector" / "engines"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "tiled_detector" / "engines"


def test_atomic_write_crash_leaves_old_file_and_no_temp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "e.engine"
    atomic_write(target, b"old")

    def crash(fd: int) -> None:
        raise OSError("disk died mid-write")

    monkeypatch.setattr(cache_mod.os, "fsync", crash)
    with pytest.raises(OSError, match="mid-write"):
        atomic_write(target, b"new" * 1000)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.engine"]


def test_get_or_build_builds_once_then_loads(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    builds = []

    def build() -> bytes:
        builds.append(1)
        return b"ENGINE"

    engine, path = cache.get_or_build(key(), build, lambda data: data.decode())
    assert engine == "ENGINE" and path == tmp_path / key().file_name and path.read_bytes() == b"ENGINE"
    engine2, _ = cache.get_or_build(key(), build, lambda data: data.decode())
    assert engine2 == "ENGINE" and len(builds) == 1
    # a different TensorRT version is a different file: built again, the old one untouched
    cache.get_or_build(key(trt_version="11.4"), build, lambda data: data.decode())
    assert len(builds) == 2 and len(list(tmp_path.glob("*.engine"))) == 2


def test_engine_that_does_not_deserialize_is_rebuilt(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    cache.path_for(key()).write_bytes(b"garbage from another TensorRT")

    def load(data: bytes) -> bytes | None:
        return data if data.startswith(b"ENGINE") else None

    engine, path = cache.get_or_build(key(), lambda: b"ENGINE v2", load)
    assert engine == b"ENGINE v2" and path.read_bytes() == b"ENGINE v2"


def test_fresh_build_that_does_not_load_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="does not load"):
        EngineCache(tmp_path).get_or_build(key(), lambda: b"x", lambda data: None)


WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tiled_detector.engines.cache import EngineCache, EngineKey
    directory, log = Path(sys.argv[1]), Path(sys.argv[2])
    key = EngineKey("m", "00", "fp32", ((1, 3, 8, 8),) * 3, "10.3", "gpu", (8, 7))
    def build():
        with open(log, "a") as f:
            f.write("build\\n")
        time.sleep(1.0)
        return b"ENGINE"
    engine, _ = EngineCache(directory).get_or_build(key, build, lambda d: d if d == b"ENGINE" else None)
    print(engine.decode())
    """
)


def test_two_processes_build_only_once(tmp_path: Path) -> None:
    log = tmp_path / "builds.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    cmd = [sys.executable, "-c", WORKER, str(tmp_path / "cache"), str(log)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs == ["ENGINE", "ENGINE"]
    assert log.read_text().count("build") == 1
