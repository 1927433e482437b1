"""On-disk cache of built TensorRT engines (and INT8 Q/DQ models), safe across processes.

The file name is a hash of everything that makes a serialized engine valid: the ONNX bytes, the precision,
the optimisation profile, the TensorRT version and the GPU (name and compute capability). A stale or foreign
engine therefore never matches, and a cached file that no longer deserializes is rebuilt, not fatal.
Builds run under a file lock so two nodes never build the same engine twice; files are written atomically
(temporary file in the same directory, fsync, `os.replace`) so nobody ever reads half an engine.
This module imports neither torch nor TensorRT.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from filelock import FileLock, Timeout

LOG = logging.getLogger(__name__)
T = TypeVar("T")
Shape = tuple[int, ...]


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/tiled_detector/engines`, or `~/.cache/tiled_detector/engines`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiled_detector" / "engines"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class EngineKey:
    """Everything a serialized engine depends on. `extra` holds further build options (e.g. calibration)."""

    model_name: str
    onnx_sha256: str
    precision: str
    profile: tuple[Shape, Shape, Shape]  # (min, opt, max) input shapes
    trt_version: str
    gpu_name: str
    compute_capability: tuple[int, int]
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len(self.profile) != 3:
            raise ValueError(f"profile must be (min, opt, max) shapes, got {self.profile!r}")
        lo, opt, hi = self.profile
        if not all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True)):
            raise ValueError(
                f"profile shapes must satisfy min <= opt <= max per dimension, got {self.profile!r}"
            )

    @property
    def digest(self) -> str:
        """Stable hex digest of all fields (the model name excluded: renaming a file keeps its engine)."""
        fields = (
            self.onnx_sha256,
            self.precision,
            repr(self.profile),
            self.trt_version,
            self.gpu_name,
            repr(self.compute_capability),
            repr(self.extra),
        )
        return hashlib.sha256("\n".join(fields).encode()).hexdigest()

    @property
    def file_name(self) -> str:
        """`<model>-<precision>-<digest16>.engine`: readable, unique per key."""
        return entry_name(self.model_name, self.precision, self.digest, ".engine")


def entry_name(model_name: str, tag: str, digest: str, suffix: str) -> str:
    """A cache entry's file name, `<model>-<tag>-<digest16><suffix>`: readable, unique per key (the model's name
    made safe for a file name)."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name) or "model"
    return f"{stem}-{tag}-{digest[:16]}{suffix}"


def atomic_write(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class CacheKey(Protocol):
    """What the cache needs of a key: the model's name (messages) and the file name that the key's digest names."""

    model_name: str

    @property
    def file_name(self) -> str: ...


class EngineCache:
    """A directory of built files (TensorRT engines by `EngineKey`, Q/DQ models by `QuantizedKey`) keyed by
    everything they depend on, shared safely by several processes."""

    def __init__(self, directory: str | Path | None = None, lock_timeout_s: float = -1.0) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.lock_timeout_s = lock_timeout_s  # -1: wait for as long as the other build takes

    def path_for(self, key: CacheKey) -> Path:
        """Where the engine for `key` lives (whether or not it exists yet)."""
        return self.directory / key.file_name

    def get_or_build(
        self, key: CacheKey, build: Callable[[], bytes], load: Callable[[bytes], T | None]
    ) -> tuple[T, Path]:
        """Load the cached engine for `key`, or build, store and load it.

        `load` turns bytes into an engine and returns None when they are not a usable engine (corrupt,
        foreign, or from another TensorRT): such a file is rebuilt. Only one process builds; the others wait
        on the lock, then load what it wrote.
        """
        path = self.path_for(key)
        loaded = self._try_load(path, load)
        if loaded is not None:
            return loaded, path
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock", timeout=self.lock_timeout_s)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            LOG.info("waiting for another process building %s", path.name)
            lock.acquire()
        try:
            loaded = self._try_load(path, load)  # the process we waited for may have built it
            if loaded is not None:
                return loaded, path
            LOG.info("building engine %s", path.name)
            data = build()
            atomic_write(path, data)
        finally:
            lock.release()
        engine = load(data)
        if engine is None:
            raise RuntimeError(f"the engine just built for {key.model_name} does not load ({path})")
        return engine, path

    @staticmethod
    def _try_load(path: Path, load: Callable[[bytes], T | None]) -> T | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        engine = load(data)
        if engine is None:
            LOG.warning("cached engine %s does not deserialize (stale or corrupt): rebuilding", path)
        return engine
