"""ament_python build of tiled_detector (colcon on Humble/Jazzy, or pip into a venv)."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "tiled_detector"

setup(
    name=PACKAGE,
    version="0.1.0",
    description="Tiled small-object detection for ROS 2 with TensorRT / ONNX Runtime / PyTorch engines.",
    license="Apache-2.0",
    python_requires=">=3.10",
    package_dir={"": "src"},
    packages=find_packages("src"),
    package_data={PACKAGE: ["models/*", "resources/*"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", [*glob("config/*.yaml"), f"src/{PACKAGE}/resources/fastdds_large_images.xml"]),
    ],
    install_requires=["setuptools"],
    zip_safe=False,
    entry_points={
        "console_scripts": [
            "tiled-detector = tiled_detector.cli:main",
            "detector_node = tiled_detector.ros.node:main",
            "detector_lifecycle_node = tiled_detector.ros.lifecycle:main",
        ],
    },
)
