-- Field case 3's update of one random row (rows: set by the recipe, see checkpoint-schema.sql).
\set id random(1, :rows)
update tbl set info = now(), crt_time = now() where id = :id;
