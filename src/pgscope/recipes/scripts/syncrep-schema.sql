-- The table of field case 1 (synchronous replication capping inserts).
create table test(id serial primary key, info text, crt_time timestamp);
