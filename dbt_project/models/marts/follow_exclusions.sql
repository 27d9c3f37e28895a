with

exclusions as (

    select * from {{ ref('int_exclusions_unioned') }}

),

sharded as (

    select
        user_id,
        excluded_id,
        reason,
        {{ shard_id('user_id') }} as shard_id
    from exclusions

)

select * from sharded
order by user_id, excluded_id, reason
