"""A central repository: runs and observations of a fleet of servers, in PostgreSQL.

A run folder serves one engineer on one host; a repository keeps every run of every server
for months (docs/repository.md). `schema.py` makes and upgrades its schema, derived from the
store's declared tables (pgscope.tables); `push.py` copies a run's store into it, one run in
one transaction, or an unfinished observation window by window; `read.py` lists runs, gives
a run's analysis back, and a run's store back into a run folder; `prune.py` drops what is
older than the team keeps.

The repository never connects to a server a run measured: everything it sends comes from
the run's store and its analysis.
"""
