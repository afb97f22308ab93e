-- Field case 1's insert, one per transaction; with -D batched=1 (the syncrep recipe's
-- batched variant) ten per transaction, so the cost per commit shows against the cost per row.
BEGIN;
insert into test(info) values (null);
\if :batched
insert into test(info) values (null);
insert into test(info) values (null);
insert into test(info) values (null);
insert into test(info) values (null);
insert into test(info) values (null);
insert into test(info) values (null);
insert into test(info) values (null);
insert into test(info) values (null);
insert into test(info) values (null);
\endif
END;
