{{ config(
    location=export_location('eligible_users', partitioned=true),
    options={'partition_by': 'shard_id', 'order_by': '(user_id)', 'overwrite': 'true'},
) }}

with

eligible_users as (

    select * from {{ ref('eligible_users') }}

)

select
    user_id,
    shard_id
from eligible_users
order by shard_id, user_id
