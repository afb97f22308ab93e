"""Where the database is: an embedded throw-away cluster, or an existing server by DSN."""
