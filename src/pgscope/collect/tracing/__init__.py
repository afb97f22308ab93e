"""Kernel-side tracing of the server: bpftrace on its USDT probes, one question per program
(`bpf/`), attached to the binary and filtered to the target's processes."""
