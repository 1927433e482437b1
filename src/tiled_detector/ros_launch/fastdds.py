"""The Fast DDS profile shipped for large images (shared-memory segment and port queue sized for 4K frames), the
environment variable each Fast DDS version reads it from, and which version this process runs.

Fast DDS 2.x (ROS 2 Humble: 2.6, Jazzy: 2.14) reads the profile named by `FASTRTPS_DEFAULT_PROFILES_FILE`
(`src/cpp/rtps/xmlparser/XMLParserCommon.cpp` at eProsima/Fast-DDS v2.6.10 and v2.14.5, and rmw_fastrtps' README on
its humble and jazzy branches); Fast DDS 3 (Kilted and later) reads `FASTDDS_DEFAULT_PROFILES_FILE`
(`src/cpp/xmlparser/XMLParserCommon.cpp` at v3.2.2) and no longer the old name. Both are set, except where the
installed Fast DDS is 3: there rmw_fastrtps (9.3.3, Kilted) also reads the old name and logs, in every process
that has it, that it is deprecated; so only the new one is set there. Imports nothing heavy: the launch file uses it.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from importlib import resources
from pathlib import Path

FASTDDS_PROFILE = Path(str(resources.files("tiled_detector") / "resources" / "fastdds_large_images.xml"))
FASTDDS_2_VARIABLE = "FASTRTPS_DEFAULT_PROFILES_FILE"  # Fast DDS 2.x: Humble, Jazzy
FASTDDS_3_VARIABLE = "FASTDDS_DEFAULT_PROFILES_FILE"  # Fast DDS 3.x: Kilted and later
PROFILE_VARIABLES = (FASTDDS_2_VARIABLE, FASTDDS_3_VARIABLE)
# Fast DDS 2.x is the library libfastrtps.so.2.*, Fast DDS 3 renamed it libfastdds.so.3.*
_LIBRARY = re.compile(r"/lib(fastrtps|fastdds)\.so\.(\d+)")


def set_variables(major: int | None) -> tuple[str, ...]:
    """The profile variables to set for an installed Fast DDS of major version `major`: both (2.x reads the old
    name and ignores the new one; unknown: both), only the new one for 3 (module docstring)."""
    return (FASTDDS_3_VARIABLE,) if major is not None and major >= 3 else PROFILE_VARIABLES


def profile_environment(profile: str | Path, major: int | None = None) -> dict[str, str]:
    """The profile variables naming `profile` for an installed Fast DDS of major version `major` (`set_variables`)."""
    return dict.fromkeys(set_variables(major), str(profile))


def with_profile(env: MutableMapping[str, str], default: str | Path = FASTDDS_PROFILE) -> None:
    """Set the profile variables for the Fast DDS `env` finds (`installed_major`) where unset: to the profile one of
    them already names, else `default`."""
    given = next((env[name] for name in reversed(PROFILE_VARIABLES) if env.get(name)), str(default))
    for name in set_variables(installed_major(env)):
        if not env.get(name):
            env[name] = given


def without_profile(env: MutableMapping[str, str]) -> None:
    """Remove both profile variables from `env` (Fast DDS's default transports)."""
    for name in PROFILE_VARIABLES:
        env.pop(name, None)


def loaded_major(maps: str) -> int | None:
    """The major version of the Fast DDS library a process has loaded, from its /proc/<pid>/maps text (None: none)."""
    found = _LIBRARY.search(maps)
    return int(found.group(2)) if found else None


def ros_library_folders(env: Mapping[str, str] | None = None) -> list[Path]:
    """The folders where `env` (default: this process's environment) finds ROS's libraries: the `lib` folders of its
    AMENT_PREFIX_PATH prefixes (unset: this Python's prefix, the PyPI wheels' ROS) and its LD_LIBRARY_PATH, those
    that exist, each once."""
    env = os.environ if env is None else env
    prefixes = (
        env.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if env.get("AMENT_PREFIX_PATH") else [sys.prefix]
    )
    folders = [Path(p) / "lib" for p in prefixes if p] + [
        Path(p) for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p
    ]
    return [folder for folder in dict.fromkeys(folders) if folder.is_dir()]


def installed_major(env: Mapping[str, str] | None = None) -> int | None:
    """The major version of the Fast DDS library installed where `env` (default: this process's environment) finds
    ROS (`ros_library_folders`; None: none found)."""
    found = [
        loaded_major(f"/{library.name}")
        for folder in ros_library_folders(env)
        for pattern in ("libfastdds.so.*", "libfastrtps.so.*")
        for library in folder.glob(pattern)
    ]
    return max((m for m in found if m is not None), default=None)


@functools.cache
def running_major() -> int | None:
    """The major version of the Fast DDS library this process has loaded (the rmw loads it with the first node;
    None before that, with another middleware, or where /proc/self/maps does not exist)."""
    try:
        return loaded_major(Path("/proc/self/maps").read_text())
    except OSError:
        return None


def profile_variables(major: int | None) -> tuple[str, ...]:
    """The variable(s) to export for Fast DDS `major`: the one it reads, or both when the version is unknown."""
    if major is None:
        return PROFILE_VARIABLES
    return (FASTDDS_2_VARIABLE,) if major < 3 else (FASTDDS_3_VARIABLE,)


def profile_in_use(env: Mapping[str, str], major: int | None) -> str | None:
    """The profile Fast DDS `major` reads from `env` (unknown version: either variable), or None."""
    return next((env[name] for name in reversed(profile_variables(major)) if env.get(name)), None)
