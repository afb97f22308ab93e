"""What the server's sessions are doing, sampled: their waits and states, through SQL or from
the server's shared memory, and pg_wait_sampling's own profile where it is installed."""
