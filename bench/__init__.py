"""The GPU checks and benchmarks of compiled layers, one module each, on the
helpers of bench/common.py. Run from the repository root with this
checkout's Python package on the path:

    PYTHONPATH=python python3 -m bench.NAME ...

(bench/device-check.sh and bench/ep-check.sh set it themselves.)
"""
