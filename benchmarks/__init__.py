"""The benchmark suite: every workload against the embedded emulator, ours beside the peers (see README.md here)."""
