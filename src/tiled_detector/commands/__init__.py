"""Subcommands of the `tiled-detector` CLI (see `tiled_detector.cli.COMMANDS`)."""
