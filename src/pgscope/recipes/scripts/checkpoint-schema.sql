-- Field case 3's table, at 3 million rows (~300 MB with its index: far more than the
-- recipe's 128 MB of shared_buffers can keep dirty). The update script picks ids in
-- 1..:rows, so keep pgscope.define.rows in the recipe equal to the count here.
create table tbl(id int primary key, info text, crt_time timestamp);
insert into tbl select g, md5(g::text), now() from generate_series(1, 3000000) g;
vacuum analyze tbl;
