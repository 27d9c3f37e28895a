with

source as (

    select * from {{ source('snapshot', 'follow_edges') }}

),

renamed as (

    select
        cast(follower_id as bigint) as follower_id,
        cast(followee_id as bigint) as followee_id,
        cast(created_at as timestamp) as followed_at,
        cast(status as varchar) as follow_status,
        cast(shard_id as integer) as snapshot_shard_id
    from source
    -- the live store forbids self-follows; a snapshot must not smuggle one in
    where follower_id <> followee_id

)

select * from renamed
