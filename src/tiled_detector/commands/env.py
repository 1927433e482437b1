"""`tiled-detector env`: versions of everything the detector depends on, and the GPU.

Versions come from package metadata, module files and the ament index, without importing heavy modules
(torch, TensorRT, rclpy); `--probe` imports torch and onnxruntime to report CUDA and ORT providers.
Runs without ROS and without this package installed (`PYTHONPATH=src python3 -m tiled_detector.cli env`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# component -> (distribution names to try, module name)
PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "numpy": (("numpy",), "numpy"),
    "opencv": (("opencv-python-headless", "opencv-python", "opencv-contrib-python"), "cv2"),
    "torch": (("torch",), "torch"),
    "onnx": (("onnx",), "onnx"),
    "onnxruntime": (("onnxruntime-gpu", "onnxruntime"), "onnxruntime"),
    "rclpy": (("ros-rclpy", "rclpy"), "rclpy"),
    "vision_msgs": (("vision_msgs", "ros-vision-msgs"), "vision_msgs"),
    "tiled_detector": (("tiled_detector", "tiled-detector"), "tiled_detector"),
}
# the same order as engines/tensorrt_api.TENSORRT_MODULES (not imported: env must not import torch)
TENSORRT_MODULES = ("tensorrt", "tensorrt_rtx", "tensorrt_lean", "tensorrt_lean_bindings")
ROS_PACKAGES = ("rclpy", "vision_msgs")


def _dist_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _module_file(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _version_in_source(path: Path, name: str = "__version__") -> str | None:
    """`name = "x.y"` read from a module's source file, without importing it."""
    try:
        match = re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", path.read_text(), re.MULTILINE)
    except OSError:
        return None
    return match.group(1) if match else None


def _ament_version(package: str) -> str | None:
    """<version> of share/<package>/package.xml in the sourced ROS workspaces (AMENT_PREFIX_PATH)."""
    for prefix in filter(None, os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep)):
        xml = Path(prefix) / "share" / package / "package.xml"
        if xml.is_file():
            match = re.search(r"<version>([^<]+)</version>", xml.read_text())
            if match:
                return match.group(1).strip()
    return None


def package_info(component: str) -> dict[str, str | None]:
    """Version and location of one component of `PACKAGES`."""
    dists, module = PACKAGES[component]
    origin = _module_file(module)
    version = _dist_version(dists)
    if version is None and component in ROS_PACKAGES:
        version = _ament_version(component)
    if version is None and origin is not None:
        version = _version_in_source(origin) or "installed (version unknown)"
    return {"version": version, "path": str(origin.parent) if origin else None}


def torch_cuda_version() -> str | None:
    """The CUDA version torch was built with, read from torch/version.py (no torch import)."""
    origin = _module_file("torch")
    return _version_in_source(origin.parent / "version.py", "cuda") if origin else None


def tensorrt_info() -> dict[str, str | None]:
    """First TensorRT binding module found, with its version (from its source, not an import)."""
    for module in TENSORRT_MODULES:
        origin = _module_file(module)
        if origin is not None:
            version = _version_in_source(origin) or "installed (version unknown)"
            return {"module": module, "version": version, "path": str(origin.parent)}
    return {"module": None, "version": None, "path": None}


def gpu_info() -> list[dict[str, str]]:
    """GPUs from nvidia-smi (name, driver, compute capability, memory); Jetson L4T release otherwise."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        fields = ["name", "driver_version", "compute_cap", "memory.total"]
        try:
            out = subprocess.run(
                [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError) as err:
            return [{"error": f"nvidia-smi failed: {err}"}]
        return [
            dict(zip(fields, (v.strip() for v in line.split(",")), strict=False)) for line in out.splitlines()
        ]
    tegra = Path("/etc/nv_tegra_release")
    if tegra.is_file():
        return [{"name": "Jetson (Tegra)", "l4t": tegra.read_text().splitlines()[0].strip()}]
    return []


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model and the cores this process may use ("AMD EPYC 7B13, 2 cores"): the model from
    /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        found = re.search(r"^(?:model name|Model|Hardware)\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
    except OSError:
        found = None
    model = found.group(1).strip() if found else platform.processor() or platform.machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores"


def probe() -> dict[str, object]:
    """Import torch and onnxruntime to report what they can use (slow: seconds)."""
    result: dict[str, object] = {}
    try:
        import torch

        result["torch_cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            result["torch_device"] = torch.cuda.get_device_name(0)
            result["torch_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    except ImportError as err:
        result["torch_error"] = str(err)
    try:
        import onnxruntime

        result["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError as err:
        result["onnxruntime_error"] = str(err)
    return result


def fastdds_profile() -> str | None:
    """The large-image Fast DDS profile this package ships (the launch file's default; the camera driver and
    `ros2 bag play` need it too): the path to export as FASTRTPS_DEFAULT_PROFILES_FILE (Fast DDS 2.x: Humble,
    Jazzy) and FASTDDS_DEFAULT_PROFILES_FILE (Fast DDS 3: Kilted and later)."""
    origin = _module_file("tiled_detector")
    profile = origin.parent / "resources" / "fastdds_large_images.xml" if origin else None
    return str(profile) if profile is not None and profile.is_file() else None


def collect(with_probe: bool = False) -> dict[str, object]:
    """Everything `env` reports, as a JSON-ready dict."""
    report: dict[str, object] = {
        "fastdds_profile": fastdds_profile(),
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": {"system": platform.platform(), "machine": platform.machine(), "cpu": cpu_name()},
        "ros_distro": os.environ.get("ROS_DISTRO"),
        "packages": {name: package_info(name) for name in PACKAGES},
        "torch_cuda": torch_cuda_version(),
        "tensorrt": tensorrt_info(),
        "gpus": gpu_info(),
    }
    if with_probe:
        report["probe"] = probe()
    return report


def format_table(report: dict[str, object]) -> str:
    """The report as an aligned two-column text table."""
    rows: list[tuple[str, str]] = [
        ("python", f"{report['python']['version']} ({report['python']['executable']})"),
        ("platform", report["platform"]["system"]),
        ("cpu", report["platform"]["cpu"]),
        ("ROS_DISTRO", report["ros_distro"] or "-"),
    ]
    for name, info in report["packages"].items():
        rows.append((name, info["version"] or "not installed"))
        if name == "torch" and info["version"]:
            rows.append(("torch CUDA", report["torch_cuda"] or "none (CPU build)"))
    trt = report["tensorrt"]
    rows.append(("tensorrt", f"{trt['version']} ({trt['module']})" if trt["module"] else "not installed"))
    for i, gpu in enumerate(report["gpus"]):
        rows.append((f"gpu {i}", ", ".join(f"{k}={v}" for k, v in gpu.items())))
    if not report["gpus"]:
        rows.append(("gpu", "none found (no nvidia-smi, not a Jetson)"))
    rows.append(("fastdds profile", report["fastdds_profile"] or "not found"))
    for key, value in report.get("probe", {}).items():
        rows.append((key, ", ".join(value) if isinstance(value, list) else str(value)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tiled-detector env`."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--probe", action="store_true", help="import torch and onnxruntime: CUDA availability, ORT providers"
    )


def run(args: argparse.Namespace) -> int:
    """Print the report."""
    report = collect(with_probe=args.probe)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0
