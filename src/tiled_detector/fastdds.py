"""The Fast DDS profile shipped for large images (shared-memory segment and port queue sized for 4K frames), the
environment variable each Fast DDS version reads it from, and which version this process runs.

Fast DDS 2.x (ROS 2 Humble: 2.6, Jazzy: 2.14) reads the profile named by `FASTRTPS_DEFAULT_PROFILES_FILE`
(`src/cpp/rtps/xmlparser/XMLParserCommon.cpp` at eProsima/Fast-DDS v2.6.10 and v2.14.5, and rmw_fastrtps' README on
its humble and jazzy branches); Fast DDS 3 (Kilted and later) reads `FASTDDS_DEFAULT_PROFILES_FILE`
(`src/cpp/xmlparser/XMLParserCommon.cpp` at v3.2.2) and no longer the old name. Setting both serves every distro.
Imports nothing heavy: the launch file uses it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, MutableMapping
from importlib import resources
from pathlib import Path

FASTDDS_PROFILE = Path(str(resources.files("tiled_detector") / "resources" / "fastdds_large_images.xml"))
FASTDDS_2_VARIABLE = "FASTRTPS_DEFAULT_PROFILES_FILE"  # Fast DDS 2.x: Humble, Jazzy
FASTDDS_3_VARIABLE = "FASTDDS_DEFAULT_PROFILES_FILE"  # Fast DDS 3.x: Kilted and later
PROFILE_VARIABLES = (FASTDDS_2_VARIABLE, FASTDDS_3_VARIABLE)
# Fast DDS 2.x is the library libfastrtps.so.2.*, Fast DDS 3 renamed it libfastdds.so.3.*
_LIBRARY = re.compile(r"/lib(fastrtps|fastdds)\.so\.(\d+)")


def profile_environment(profile: str | Path) -> dict[str, str]:
    """Both profile variables naming `profile` (each Fast DDS version reads one of them)."""
    return dict.fromkeys(PROFILE_VARIABLES, str(profile))


def with_profile(env: MutableMapping[str, str], default: str | Path = FASTDDS_PROFILE) -> None:
    """Set both profile variables in `env` where unset: to the profile one of them already names, else `default`."""
    given = next((env[name] for name in reversed(PROFILE_VARIABLES) if env.get(name)), str(default))
    for name in PROFILE_VARIABLES:
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
