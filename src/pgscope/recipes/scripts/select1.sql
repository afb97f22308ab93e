-- The cheapest statement there is: whatever per-statement cost the server adds (statement
-- logging, for one) dominates its time. `pgscope run logging --script select1.sql`.
select 1;
