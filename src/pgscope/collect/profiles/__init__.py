"""Where the server's processes spend CPU and off-CPU time: perf and bpftrace stacks, folded
per process role and stored per step."""
