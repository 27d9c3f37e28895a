{{ config(
    location=export_location('follow_exclusions', partitioned=true),
    options={
        'partition_by': 'shard_id',
        'order_by': '(user_id, excluded_id, reason)',
        'overwrite': 'true',
    },
) }}

with

follow_exclusions as (

    select * from {{ ref('follow_exclusions') }}

)

select
    user_id,
    excluded_id,
    reason,
    shard_id
from follow_exclusions
order by shard_id, user_id, excluded_id, reason
