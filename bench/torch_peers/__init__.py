"""The benchmarks of bench/torch-peers.py, one module each; common.py has their helpers."""
