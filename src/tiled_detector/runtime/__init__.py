"""The process and the device it runs on: torch devices and CUDA graphs, CPU threads, stage clocks, errors in one line."""
