{#-
    The stable shard of a user id: the SQL spelling of recs.sharding.shard_sql (ARCHITECTURE §5).

    shard_id(user_id) = ((user_id * 2654435761) mod 2**32) div 2**16 mod shard_count

    Knuth's multiplicative hash (TAOCP vol. 3, §6.4): keep the low 32 bits of the product, take
    their high 16 bits, reduce modulo the shard count. Integer arithmetic only, never an engine's
    hash(), so it is identical in Python, Polars, NumPy and DuckDB. The low 32 bits of the
    product only depend on the low 32 bits of the id, so the id is reduced first and the product
    (< 2**64) fits a UBIGINT: no HUGEINT arithmetic per row. tests/dbt checks this macro
    against recs.sharding.shard_of on thousands of ids; every night, each shard task checks
    that its eligible users (partitioned by this macro) and its snapshot partition's followers
    (by recs.sharding) are its own (recs.traversal.inputs; cap_graph checks the followers of
    every file it caps: recs.sharding.misfiled). Ids must be >= 0. Returns INTEGER.
-#}
{%- macro shard_id(column, shard_count=none) -%}
    {%- set shard_count = var('shard_count') if shard_count is none else shard_count -%}
    ((((({{ column }}) % 4294967296)::ubigint * 2654435761) % 4294967296) // 65536 % {{ shard_count }})::integer
{%- endmacro -%}
