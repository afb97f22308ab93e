"""What the server counts: its cumulative statistics, statements and tables, plans sampled
while the load runs, relation locks held, the host's CPU, and the WAL device's bandwidth."""
